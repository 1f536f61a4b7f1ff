"""The text analyzers a collective may name in its created event (``language``); what
each does is ``projections.language``'s. A module of names only, so that the command
line can offer them without importing the analyzers or the limits' numpy."""

from __future__ import annotations

import re

# "" in an event (one written before languages existed) is English
ENGLISH = "english"  # tantivy's en_stem
SIMPLE = "simple"  # lower case, no stemming: language-independent
# those with a Snowball stemmer (PyStemmer), English aside
SNOWBALL = (
    "arabic", "armenian", "basque", "catalan", "czech", "danish", "dutch", "esperanto",
    "estonian", "finnish", "french", "german", "greek", "hindi", "hungarian", "indonesian",
    "irish", "italian", "lithuanian", "nepali", "norwegian", "persian", "polish",
    "portuguese", "romanian", "russian", "serbian", "spanish", "swedish", "tamil",
    "turkish", "yiddish",
)  # fmt: skip
LEMMATIZED = ("ukrainian",)  # a dictionary's lemmas (pymorphy3)
SPACELESS = ("chinese", "japanese")  # written without spaces: character pairs
LANGUAGES = (ENGLISH, SIMPLE, *SNOWBALL, *LEMMATIZED, *SPACELESS)
LANGUAGE_MAX = max(len(name) for name in LANGUAGES)
# not an analyzer: each document's own language, detected from its text
# (``projections.language``); what a collective chooses unless it fixes one
AUTO = "auto"

_SPACELESS = re.compile(
    "[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    "\U00020000-\U0003134f]"
)


def of_name(text: str) -> str:
    """The analyzer "auto" chose from a collective's name before languages per document
    (schema 4 and before), by its script: kana (Japanese), Han (Chinese), Cyrillic
    letters of Ukrainian's that Russian lacks (і ї є ґ) or of Russian's that Ukrainian
    lacks (ы э ъ ё), Greek, Arabic; English for plain ASCII; ``simple`` for anything else
    (Korean included). Reading an old collective's created event, a language equal to
    this one is taken for "auto" (``eventlog.codec``'s upcaster of schema 4): nobody can
    tell it from the same language named on purpose, and per-document detection gives
    text of that language the same analysis."""
    letters = [c for c in text if c.isalpha()]
    if not letters or all(c.isascii() for c in letters):
        return ENGLISH
    if any("\u3040" <= c <= "\u30ff" for c in letters):
        return "japanese"
    if any("\uac00" <= c <= "\ud7af" for c in letters):
        return SIMPLE
    if any(_SPACELESS.fullmatch(c) for c in letters):
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
