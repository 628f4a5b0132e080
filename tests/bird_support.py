"""The small bird corpus the BM25 response tests search: six notes of growing kestrel weight,
a two-page PDF field guide, and whatever file the test adds (``extra``)."""

from groundkit_datasette.indexing.ingest import ingest

from .pdf_support import make_pdf


def build_birds(tmp_path, extra: dict[str, str]):
    """``(corpus, index_dir)`` of the BM25-only collection ``birds``."""
    corpus = tmp_path / "corpus"
    (corpus / "notes").mkdir(parents=True)
    for i in range(6):
        (corpus / "notes" / f"n{i}.txt").write_text(
            f"Kestrel notes {i}.\n\n" + "kestrel falcon migration " * (i + 1) + f"\n\nmarker{i}\n")
    for name, text in extra.items():
        (corpus / name).write_text(text, encoding="utf-8")
    (corpus / "field.pdf").write_bytes(make_pdf([
        ["Field guide, page one.", "The kestrel hovers over the meadow."],
        ["Page two.", "A falcon stoops at speed; kestrel and falcon compared."],
    ]))
    index_dir = tmp_path / "index"
    ingest([corpus], collection="birds", index_dir=index_dir, embedder="none")
    return corpus, index_dir
