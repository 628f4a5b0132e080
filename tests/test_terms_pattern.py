"""The lazily compiled CJK patterns (tokenizer.LazyPattern, cold start) still behave as the compiled
patterns they replace where Python copies or pickles an object: a copy or a pickle round trip
of one, before or after its first use, tokenizes as ``re.compile`` of its source does (a
compiled pattern always could; the lazy one recursed until RecursionError)."""

import copy
import pickle
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from groundkit_datasette.indexing import tokenizer

TEXT = "日本語の文書です。Solar panels, 東京 and ｶﾀｶﾅ words"


def test_a_lazy_pattern_copies_and_pickles_before_and_after_first_use():
    for source in (tokenizer.TOKEN._source, tokenizer.CJK_CHAR._source):
        want = re.compile(source).findall(TEXT)
        for used in (False, True):
            pattern = tokenizer.LazyPattern(source)
            if used:
                assert pattern.findall(TEXT) == want
            for clone in (copy.copy(pattern), copy.deepcopy(pattern), pickle.loads(pickle.dumps(pattern))):
                assert clone.findall(TEXT) == want
                assert clone.pattern == source
    # The module's own patterns, as a search leaves them.
    assert pickle.loads(pickle.dumps(tokenizer.TOKEN)).findall(TEXT) == tokenizer.TOKEN.findall(TEXT)


ASCII_TEXT = st.text(alphabet=st.characters(max_codepoint=127), max_size=200)


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(ASCII_TEXT, st.text(max_size=200)))
def test_the_ascii_shortcut_finds_the_tokens_the_whole_pattern_finds(text):
    # tokenizer.words takes \w+ on ASCII text (ingest and queries tokenize through it): it must
    # give exactly the whole pattern's tokens, on any text, ASCII or not.
    low = text.lower()
    assert tokenizer.words(low) == re.compile(tokenizer.TOKEN._source).findall(low)
