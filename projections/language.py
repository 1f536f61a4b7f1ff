"""Text analysis per collective: how its words become the terms its full-text search
matches.

A collective names its language once, in its created event (``language``), so every host
indexes its text the same way and a rebuild reproduces it. The analyzers:

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


ANALYSIS_VERSION = 1  # this module's own rules (the word pattern, the grams, the caching)
ANALYSIS_PACKAGES = ("PyStemmer", "pymorphy3", "pymorphy3-dicts-uk")


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


def detect(text: str) -> str:
    """The language a collective named ``text`` is most likely written in, judged by its
    script: kana (Japanese), Han (Chinese), Cyrillic letters of Ukrainian's that Russian
    lacks (і ї є ґ; Belarusian's і too reads as Ukrainian) or of Russian's that Ukrainian
    lacks (ы э ъ ё), Greek, Arabic. Plain ASCII means English (as every collective before
    languages); anything else it cannot tell, Korean included, is ``simple`` (whose
    analysis cuts hangul into pairs as it does Han)."""
    letters = [c for c in text if c.isalpha()]
    if not letters or all(c.isascii() for c in letters):
        return ENGLISH
    if any("\u3040" <= c <= "\u30ff" for c in letters):
        return "japanese"
    if any("\uac00" <= c <= "\ud7af" for c in letters):
        return SIMPLE  # Korean: no analyzer of its own; hangul runs become pairs in any
    if any(_SPACELESS_RUN.fullmatch(c) for c in letters):
        return "chinese"
    lowered = set(text.lower())
    if lowered & set("іїєґ"):
        return "ukrainian"
    if lowered & set("ыэъё"):
        return "russian"
    if any("\u0370" <= c <= "\u03ff" for c in letters):
        return "greek"
    if any("\u0600" <= c <= "\u06ff" for c in letters):
        return "arabic"
    return SIMPLE


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
