"""Text analysis: how words become the terms full-text search matches.

A collective names its language once, in its created event (``language``): one analyzer
for all its text, or "auto" (the default), each text in the language its writer detected
(``of_text``, recorded in the event that records the text) and each query in every
language it could be (``of_query``). Either way every host indexes a text the same way
and a rebuild reproduces it. The analyzers:

- ``english``: tantivy's own ``en_stem`` (lower case, English Snowball stems). What every
  collective used before languages existed; events without the field read as English.
- a language with a Snowball stemmer (``german``, ``russian``, ``french``, ...): words in
  lower case, stemmed. German's stemmer also folds umlauts (Häuser and Haus meet).
- ``ukrainian``: no Snowball stemmer exists, so words are reduced to their dictionary
  form by a morphological analyzer (pymorphy3 with its Ukrainian dictionary): публікацію,
  публікації and публікація all become публікація.
- ``chinese``, ``japanese``: scripts written without spaces. Runs of Han, kana or hangul
  are cut into overlapping pairs of characters (bigrams), the way Lucene's CJK analyzer
  does, with no dictionary: 数据库连接 gives 数据 据库 库连 连接, so a query for 数据库 or
  连接 matches it. Other words in the text are lower-cased.
- ``simple``: lower case, no stemming; the language-independent choice.

Every analyzer but ``english`` also gives each word's character trigrams, a second
field searched beside the words with less weight. They are the fallback where the word
analysis misses: a German compound (Datenbankverbindung holds the trigrams of Verbindung),
a form the dictionary does not know, a language without an analyzer. For scripts without
spaces the single characters play that part.

The analysis runs in Python and hands tantivy finished terms (a field split on
whitespace), so one code path serves every language; tantivy-py can neither split words
into n-grams nor lemmatize. The libraries a language needs are imported when a collective
of that language is first indexed or searched, never before.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from eventlog.languages import (
    AUTO,
    ENGLISH,
    LANGUAGE_MAX,
    LANGUAGES,
    LEMMATIZED,
    SIMPLE,
    SNOWBALL,
    SPACELESS,
)

__all__ = ["ENGLISH", "LANGUAGES", "LEMMATIZED", "SIMPLE", "SNOWBALL", "SPACELESS", "AUTO"]

WORD_MAX = 64  # characters; longer runs (hashes, base64) are not words anyone searches for
# the scripts written without spaces: Han, kana, hangul syllables and their extensions
_SPACELESS_CHAR = (
    "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    "\U00020000-\U0003134f"
)
_SPACELESS_RUN = re.compile(f"[{_SPACELESS_CHAR}]+")
_APOSTROPHES = str.maketrans({"’": "'", "ʼ": "'"})


@lru_cache(maxsize=1)
def _word() -> re.Pattern[str]:
    """Runs of letters or digits and the combining marks that belong to them, with inner
    apostrophes (Ukrainian з'єднання, English don't); the underscore is a separator, as in
    snake_case names. Python's ``\\w`` leaves the marks out, and they are letters' parts in
    many scripts: Devanagari's and Tamil's vowel signs and viramas, Arabic's and Hebrew's
    vowel points. Their ranges are read from the Unicode database once, when first used."""
    ranges: list[list[int]] = []
    for code in [*range(0x20000), *range(0xE0100, 0xE01F0)]:
        if unicodedata.category(chr(code))[0] == "M":
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    marks = "".join(f"{chr(a)}-{chr(b)}" if b > a else chr(a) for a, b in ranges)
    part = f"[^\\W_](?:[^\\W_]|[{marks}])*"  # a letter or digit first, then marks too
    return re.compile(f"{part}(?:['’ʼ]{part})*")


# this module's own rules (the word pattern, the grams, the caching); 2: languages per
# document (a document's detected language, a query's candidates)
ANALYSIS_VERSION = 2
ANALYSIS_PACKAGES = ("PyStemmer", "pymorphy3", "pymorphy3-dicts-uk", "lingua-language-detector")


def fingerprint() -> str:
    """What the terms of an index depend on beyond its schema: these rules' version and
    the versions of the stemmers and the dictionary. An index made under another is
    made again (``projections.text``): a stemmer's new release may stem a word otherwise."""
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"pulse-analysis {ANALYSIS_VERSION}"]
    for package in ANALYSIS_PACKAGES:
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            parts.append(f"{package} none")
    return "\n".join(parts) + "\n"


def check(language: str) -> str:
    """``language`` if Pulse has an analyzer of that name, else ValueError naming them."""
    if language not in LANGUAGES:  # (the caller's error names the field)
        raise ValueError(
            f"{language[:LANGUAGE_MAX]!r} is not a language Pulse analyzes; choose one of "
            f"{', '.join(LANGUAGES)} (or {AUTO})"
        )
    return language


# -- the language of a text (a collective of "auto") ------------------------------------

DETECTED_CHARS = 2000  # of a text, what its language is judged by (the start of it)
LETTERS_MIN = 8  # fewer letters of prose: too short to tell (analyzed as ``simple``)
CONFIDENT = 0.1  # a query's candidate languages: the detector's confidence, at least
# what is code rather than prose, left out before detection: tokens (runs of characters
# other than spaces and spaceless scripts) holding a digit or a character of code
# (snake_case, paths, calls, dotted names), camelCase, ALL CAPS. Each token is looked at
# once, so the time is linear in the text's length
_TOKEN = re.compile(f"[^\\s{_SPACELESS_CHAR}]+")
_CODE = re.compile(r"[\d_/\\=<>{}\[\]()`#@$|~*^;:]|\.\w|[a-z][A-Z]|\b[A-Z]{2,}")
_CYRILLIC = re.compile("[\u0400-\u04ff]")
_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff]")


@lru_cache(maxsize=1)
def _detector() -> Any:
    """lingua's detector over the languages Pulse analyzes, in its low accuracy mode
    (about 90 MB and 0.2 s to load, 0.1 ms a call; the high one needs about 800 MB and
    3 s, and told the project's labelled lessons apart no better: 477 of 480 either
    way). Built at the first use, once per process."""
    from lingua import Language, LanguageDetectorBuilder

    known = {language.name.lower(): language for language in Language.all()}
    chosen = [known[name] for name in LANGUAGES if name in known]
    chosen += [known[name] for name in _NAMED_OTHERWISE if name in known]
    return (
        LanguageDetectorBuilder.from_languages(*chosen)
        .with_low_accuracy_mode()
        .with_minimum_relative_distance(0.1)
        .with_preloaded_language_models()
        .build()
    )


# lingua's names of languages Pulse analyzes under another name (Norwegian's written
# forms). Nepali and Yiddish it does not know: their text is detected as another's
_NAMED_OTHERWISE = {"bokmal": "norwegian", "nynorsk": "norwegian"}


def _named(language: Any) -> str:
    """Pulse's name of a language lingua found."""
    name = str(language.name).lower()
    return _NAMED_OTHERWISE.get(name, name)


def detector_ready() -> bool:
    """Whether this process has built the detector already (``_detector``)."""
    return _detector.cache_info().currsize > 0


def load_detector() -> None:
    """Build the detector now (``_detector``), e.g. on a thread before the first use."""
    _detector()


def _prose(text: str) -> str:
    """``text`` without what reads as code (identifiers, paths, numbers): a note about
    ``statement_cache_size`` in a Ukrainian sentence is Ukrainian."""
    return _TOKEN.sub(_unless_code, text[:DETECTED_CHARS])


def _unless_code(token: re.Match[str]) -> str:
    return " " if _CODE.search(token.group()) else token.group()


def of_text(text: str) -> str:
    """The language a document's ``text`` is written in, among those Pulse analyzes:
    what the detector tells from its prose, ``simple`` when the prose is too short to
    tell or the detector cannot choose. Recorded in the event that records the text (the
    writer's judgement, the same on every host)."""
    prose = _prose(text)
    if sum(c.isalpha() for c in prose) < LETTERS_MIN:
        return SIMPLE
    found = _detector().detect_language_of(prose)
    return SIMPLE if found is None else _named(found)


def of_query(text: str) -> tuple[str, ...]:
    """The languages a query's ``text`` could be written in, to analyze it in each: those
    the detector gives a confidence of at least ``CONFIDENT``, English for text with
    Latin letters (a query is short, and names and terms of art are English in any
    language), Ukrainian and Russian for Cyrillic (a few words rarely tell them apart),
    Chinese for Han and Japanese for kana, and ``simple`` always. In a stable order."""
    found = {SIMPLE}
    prose = _prose(text)
    if any(c.isascii() and c.isalpha() for c in text):
        found.add(ENGLISH)
    if _CYRILLIC.search(text):
        found.update(("ukrainian", "russian"))
    if _KANA.search(text):
        found.add("japanese")
    elif _SPACELESS_RUN.search(text):
        found.add("chinese")
    if sum(c.isalpha() for c in prose) >= 3:
        for confidence in _detector().compute_language_confidence_values(prose):
            if confidence.value < CONFIDENT:
                break  # (highest first)
            found.add(_named(confidence.language))
    return tuple(name for name in LANGUAGES if name in found)


# English in a collective of "auto": tantivy's English words, and the grams every other
# language's text has, so that a query's grams weigh alike in documents of any language
# (without them, an English query's grams scored only the other languages' documents)
ENGLISH_AMONG_OTHERS = "english+grams"


def of_document(recorded: str | None, text: str) -> str:
    """The analyzer of a document in a collective of "auto": the language its event
    recorded (``simple`` for a name this release does not know), or for one recorded
    before languages per document, the one detected from its text here."""
    if recorded:
        return recorded if recorded in LANGUAGES else SIMPLE
    return of_text(text)


class Analysis:
    """The terms of one text: ``words`` (normalized words) and ``grams`` (the words'
    character trigrams, or single characters of spaceless scripts)."""

    __slots__ = ("words", "grams")

    def __init__(self, words: list[str], grams: list[str]) -> None:
        self.words, self.grams = words, grams


def _normal(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).casefold()
    return folded.replace("i\u0307", "i")  # Turkish İ folds to i and a dot above: just i


def _trigrams(word: str) -> Iterator[str]:
    if len(word) <= 3:
        yield word
        return
    for i in range(len(word) - 2):
        yield word[i : i + 3]


def _bigrams(run: str) -> Iterator[str]:
    if len(run) == 1:
        yield run
        return
    for i in range(len(run) - 1):
        yield run[i : i + 2]


LEMMAS_MAX = 3  # dictionary forms kept of a word the dictionary reads more than one way


TOKENS_CACHED = 200_000  # analyzed tokens kept per language (a collective's vocabulary)

Terms = tuple[tuple[str, ...], tuple[str, ...]]  # a token's words and grams


@lru_cache(maxsize=len(LANGUAGES))
def _token_terms(language: str) -> Callable[[str], Terms]:
    """The function, cached, that turns one lower-cased token (a run of letters and
    digits) into its words and grams: most of a collective's text is words it has seen,
    so most of the analysis is a dictionary lookup."""
    form = _word_form(language)

    def terms(token: str) -> Terms:
        words: list[str] = []
        grams: list[str] = []
        start = 0
        for run in _SPACELESS_RUN.finditer(token):  # spaceless scripts: pairs, then chars
            if run.start() > start:
                _add_word(token[start : run.start()], form, words, grams)
            words.extend(_bigrams(run.group()))
            grams.extend(run.group())
            start = run.end()
        if start < len(token):
            _add_word(token[start:], form, words, grams)
        return tuple(words), tuple(grams)

    cached = lru_cache(maxsize=TOKENS_CACHED)(terms)
    # a token longer than a word (a run of Chinese, a hash) is analyzed but not kept
    return lambda token: cached(token) if len(token) <= WORD_MAX else terms(token)


def _word_form(language: str) -> Callable[[str], tuple[str, ...]]:
    """The function that turns one lower-cased word into its terms."""
    if language in SNOWBALL:
        import Stemmer  # type: ignore[import-not-found]  # PyStemmer: Snowball stemmers, in C

        stem = Stemmer.Stemmer(language).stemWord
        return lambda word: (stem(word),)
    if language in LEMMATIZED:
        import pymorphy3  # type: ignore[import-untyped]  # its Ukrainian dictionary: a package

        morph = pymorphy3.MorphAnalyzer(lang="uk")

        def lemmas(word: str) -> tuple[str, ...]:
            # every reading's dictionary form: the Ukrainian dictionary ranks none above
            # another (базі is a form of база and of базь), and a query and a document
            # match when they share any (даних and дані both read as даний)
            if not word.replace("'", "").isalpha():  # numbers, codes: nothing to read
                return (word,)
            try:
                parses = morph.parse(word)
            except ValueError:  # it asks unicodedata for names some letters lack (Tangut)
                return (word,)
            forms = dict.fromkeys(str(parse.normal_form) for parse in parses)
            return tuple(forms)[:LEMMAS_MAX] or (word,)

        return lemmas
    # simple, chinese and japanese: words as they are (every analyzer cuts spaceless runs
    # into pairs, so the three analyze alike; the names say what a collective holds)
    return lambda word: (word,)


def analyze(language: str, text: str) -> Analysis:
    """The terms ``text`` gives in a collective of ``language`` (not English: tantivy
    analyzes that itself)."""
    terms = _token_terms(language)
    words: list[str] = []
    grams: list[str] = []
    for token in _word().findall(_normal(text)):
        token_words, token_grams = terms(token)
        words += token_words
        grams += token_grams
    return Analysis(words, grams)


def _add_word(
    word: str, form: Callable[[str], tuple[str, ...]], words: list[str], grams: list[str]
) -> None:
    if len(word) > WORD_MAX:
        return
    words.extend(form(word))
    grams.extend(_trigrams(word))
