"""The tokenizer, one for documents and queries alike: the terms ingest stores
(indexing/terms.py) and the terms a search looks up (retrieval/bm25.py) are cut by these rules.
"""

import re

import Stemmer

# Han (ideographs, their extensions and compatibility forms), Hiragana, Katakana (with the
# half-width forms) and Hangul (syllables and jamo): scripts written without spaces.
_CJK = ("\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
        "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f")


class LazyPattern:
    """A regular expression compiled on first use: each of the two below takes about 8 ms
    to compile, and a search for an ASCII query needs neither (cold start, issue 14)."""

    def __init__(self, source: str):
        self._source = source

    def __getattr__(self, name):  # only until compiled: then the methods are attributes
        if name.startswith("_"):  # ``_source`` before __init__, and what copy and pickle probe
            raise AttributeError(name)
        compiled = re.compile(self._source)
        for method in ("findall", "finditer", "match", "search", "fullmatch", "sub", "split"):
            setattr(self, method, getattr(compiled, method))
        return getattr(compiled, name)


# A token is a run of CJK characters or a run of other word characters (``\w`` minus CJK).
TOKEN = LazyPattern(f"[{_CJK}]+|[^\\W{_CJK}]+")
CJK_CHAR = LazyPattern(f"[{_CJK}]")
# TOKEN on a string without CJK characters: its second branch, ``[^\W<CJK>]+``, is ``\w+``
# there, and ``\w+`` runs about 1.5x faster (ingest tokenizes every chunk; a query too).
_ASCII_WORD = re.compile(r"\w+")


# ``\w+`` of lower-cased ASCII text, in one C pass over bytes: letters lower-cased, digits and
# "_" kept, every other byte a space (about 4x faster than the regex; ingest tokenizes every chunk).
_ASCII_FOLD = bytes(c + 32 if 65 <= c <= 90 else c if c < 128 and (chr(c).isalnum() or c == 95) else 32
                    for c in range(256))


def ascii_words(text: str) -> list[bytes]:
    """``words(text.lower())`` of an ASCII ``text``, as bytes."""
    return text.encode("ascii").translate(_ASCII_FOLD).split()


def words(low: str) -> list[str]:
    """``TOKEN``'s matches in lower-cased ``low``: the words and CJK runs it holds."""
    return _ASCII_WORD.findall(low) if low.isascii() else TOKEN.findall(low)


# What the stored terms were tokenized with (the manifest's ``tokenizer``): words, stemmed, and
# runs of CJK characters as overlapping character bigrams (adr/0022-cjk-search.md).
TOKENIZER = "words+cjk-bigrams-1"

STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves s t don
    """.split()
)

STEMMER = Stemmer.Stemmer("english")


def cjk_bigrams(run: str) -> list[str]:
    """Overlapping character bigrams of a CJK run; a lone character stands for itself."""
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def cjk_terms(text: str) -> list[str]:
    """The bigrams of the CJK runs in ``text`` (what Datasette's CJK search indexes)."""
    return [b for token in TOKEN.findall(text) if CJK_CHAR.match(token)
            for b in cjk_bigrams(token)]


def has_cjk(text: str) -> bool:
    return CJK_CHAR.search(text) is not None


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens, stop words removed, Snowball-stemmed; CJK runs as bigrams.

    Any string is a valid query: there is no query syntax to inject into.
    """
    out: list[str] = []
    for token in words(text.lower()):
        if CJK_CHAR.match(token):
            out += cjk_bigrams(token)
        elif token not in STOP_WORDS:
            out.append(STEMMER.stemWord(token))
    return out

