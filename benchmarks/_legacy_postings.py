"""``rebuild_postings`` as it was before issue 14 (indexing/terms.py at f3d3092): the
baseline of benchmarks/ingest.py's memory figures, and the oracle that
tests/test_ingest_postings.py compares the streamed rebuild with, row for row."""

import numpy as np

from groundkit_datasette.indexing import postings


def rebuild_postings(conn, k1=postings.K1, b=postings.B):
    """Every (term, chunk) pair decoded at once, weights computed in one vectorised pass."""
    rows = conn.execute(
        "SELECT t.id, t.length, t.term_ids, t.term_freqs, c.document_id FROM bm25_chunk_terms t "
        "JOIN chunks c ON c.id = t.id ORDER BY t.id"
    ).fetchall()
    conn.execute("DELETE FROM bm25_postings")
    if not rows:
        conn.execute("DELETE FROM bm25_vocab")
        return
    chunk_ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    lengths = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
    term_ids = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.int32)
    freqs = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.int32).astype(np.float64)
    per_chunk = np.fromiter((len(r[2]) // 4 for r in rows), dtype=np.int64, count=len(rows))
    ordinal = {}
    doc_of_chunk = np.fromiter(
        (ordinal.setdefault(r[4], len(ordinal)) for r in rows), dtype=np.int64, count=len(rows))
    avgdl = max(lengths.mean(), 1e-9)
    vocab_size = int(term_ids.max()) + 1 if term_ids.size else 0
    order = np.argsort(term_ids, kind="stable")
    sorted_terms = term_ids[order]
    owner_doc = np.repeat(doc_of_chunk, per_chunk)[order]
    if np.all(np.diff(doc_of_chunk) >= 0):
        first = np.ones(sorted_terms.size, dtype=bool)
        first[1:] = (sorted_terms[1:] != sorted_terms[:-1]) | (owner_doc[1:] != owner_doc[:-1])
        df = np.bincount(sorted_terms[first], minlength=vocab_size)
    else:
        pairs = np.unique(sorted_terms.astype(np.int64) * len(ordinal) + owner_doc)
        df = np.bincount(pairs // len(ordinal), minlength=vocab_size)
    idf = postings.idf_of(len(ordinal), df)
    dl = np.repeat(lengths, per_chunk)
    weights = idf[term_ids] * freqs * (k1 + 1) / (freqs + k1 * (1 - b + b * dl / avgdl))
    owner = np.repeat(chunk_ids, per_chunk)[order].astype(np.int32)
    weights = weights[order].astype(np.float32)
    present = np.flatnonzero(df)
    bounds = np.searchsorted(sorted_terms, present)
    ends = np.append(bounds[1:], sorted_terms.size)
    conn.executemany(
        "INSERT INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, ?)",
        ((int(t), owner[s:e].tobytes(), weights[s:e].tobytes()) for t, s, e in zip(present, bounds, ends)))
    tie_order = [r[0] for r in conn.execute("SELECT id FROM chunks ORDER BY content_hash, id")]
    conn.execute("INSERT INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, x'')",
                 (postings.TIE_ORDER_ID, np.asarray(tie_order, dtype=np.int32).tobytes()))
    documents = np.full(int(chunk_ids[-1]) + 1, -1, dtype=np.int32)
    documents[chunk_ids] = doc_of_chunk
    conn.execute("INSERT INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, x'')",
                 (postings.DOCUMENT_MAP_ID, documents.tobytes()))
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _df(term_id INTEGER PRIMARY KEY, n INTEGER)")
    conn.execute("DELETE FROM _df")
    conn.executemany("INSERT INTO _df VALUES (?, ?)", ((int(t), int(df[t])) for t in present))
    conn.execute("DELETE FROM bm25_vocab WHERE term_id NOT IN (SELECT term_id FROM _df)")
    conn.execute("UPDATE bm25_vocab SET doc_freq = (SELECT n FROM _df WHERE _df.term_id = bm25_vocab.term_id)")
    conn.execute("DROP TABLE _df")
