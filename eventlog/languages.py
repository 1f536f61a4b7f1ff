"""The text analyzers a collective may name in its created event (``language``); what
each does is ``projections.language``'s. A module of names only, so that the command
line can offer them without importing the analyzers or the limits' numpy."""

from __future__ import annotations

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
AUTO = "auto"  # not an analyzer: asks for one chosen from the collective's name
