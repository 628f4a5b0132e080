"""What a fresh process does before its first BM25 answer (issue 14, cold start): a search
flags stale hits without importing the citation verifier (stale.py, apart from
citations.py), and an ASCII query compiles neither CJK pattern (tokenizer.LazyPattern). Real
collections, real fresh interpreters; the answers are checked, not only the imports."""

import json
import os
import subprocess
import sys

from groundkit_datasette.indexing.ingest import ingest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.indexing import tokenizer
col = Collection.open("cold", index_dir={index!r})
seen = {{}}
r = col.search(query={query!r}, mode="bm25", top_k=5)
seen["hits"] = [(h.source, h.source_changed, h.matched_terms) for h in r.hits]
seen["citations imported"] = "groundkit_datasette.retrieval.citations" in sys.modules
seen["patterns compiled"] = ["findall" in vars(p) for p in (tokenizer.TOKEN, tokenizer.CJK_CHAR)]
later = col.search(query="日本語の文書", mode="bm25", top_k=5)
seen["cjk hits"] = [h.source for h in later.hits]
seen["patterns compiled after"] = ["findall" in vars(p) for p in (tokenizer.TOKEN, tokenizer.CJK_CHAR)]
print(json.dumps(seen))
"""


def _child(index_dir, query):
    code = _CHILD.format(root=ROOT, index=str(index_dir), query=query)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_first_ascii_bm25_search_needs_no_verifier_and_no_cjk_pattern(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "energy.md").write_text("# Energy\n\nSolar panels convert sunlight into power.\n")
    (corpus / "tides.md").write_text("# Tides\n\nThe moon pulls the oceans into tides.\n")
    (corpus / "ja.md").write_text("# 日本\n\n日本語の文書です。\n")
    ingest([corpus], collection="cold", index_dir=tmp_path / "i", embedder="none")
    seen = _child(tmp_path / "i", "solar power")
    assert seen["hits"] == [["energy.md", False, ["solar", "power"]]]
    assert seen["citations imported"] is False
    assert seen["patterns compiled"] == [False, False]
    # The patterns compile on first use, and a CJK query finds its document.
    assert seen["cjk hits"] == ["ja.md"]
    assert seen["patterns compiled after"] == [True, True]
    # A file edited after ingest is still flagged by the first search of a fresh process.
    (corpus / "energy.md").write_text("# Energy\n\nSolar panels convert sunlight into more power.\n")
    assert _child(tmp_path / "i", "solar power")["hits"] == [["energy.md", True, ["solar", "power"]]]
