"""Chunk vectors in LanceDB, keyed by ``chunk_id``: the writer.

The SQLite manifest names the table version it goes with (``lance_version``);
readers check that version out, so vectors written by an unfinished ingest
are never seen. ``VectorWriter`` applies one ingest run's changes to the table, keeps
LanceDB's own ANN index current and writes the index file (indexing/vector_index.py) that
queries read. The query side lives in indexing/vector_search.py and vector_index.py;
``open_table``, ``VectorSearch`` and ``IndexSearch`` are importable from here too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .vector_index import (INDEX_SUBDIR, IndexFile, IndexPart, IndexSearch,
                           build_index_from_table, index_file_name, write_delta_index)
from .vector_search import TABLE, VectorSearch, open_table

__all__ = ["VectorWriter", "VectorSearch", "IndexSearch", "open_table", "ANN_INDEX",
           "ANN_THRESHOLD"]

ADD_BATCH = 4096
# Below this many vectors an exact scan is fast enough and always exact.
ANN_THRESHOLD = 5000
ANN_INDEX = "IVF_HNSW_SQ"
# Index upkeep (adr/0030-postings-and-index-upkeep.md). Rows the index does not cover are
# scanned exactly by every query; up to this many (or this share of the table) stay so.
ANN_UNINDEXED_ROWS = 2000
ANN_UNINDEXED_FRACTION = 0.01
# Past that, the new rows are added to the trained index (``optimize``: partitions are
# kept, nothing is retrained) until the table holds this many times the rows it was
# trained on; then the index is trained again from every row.
ANN_RETRAIN_GROWTH = 1.5
# ``optimize`` never prunes versions: readers hold the published one, and a dead run is
# rolled back to it (adr/0002).
_KEEP_VERSIONS_DAYS = 365 * 100
# A run keeps at most this many of its added vectors for the index file's delta.
_RUN_KEEP_MAX = 50_000
# A delta holds at most this many rows (added plus deleted) or this share of the base, as
# LanceDB's unindexed tail does (adr/0030); past that the base file is written again (its
# lists kept, vectors reassigned) and, past INDEX_RETRAIN_GROWTH x the rows the lists were
# trained on, the lists are trained again.
INDEX_DELTA_ROWS = ANN_UNINDEXED_ROWS
INDEX_DELTA_FRACTION = ANN_UNINDEXED_FRACTION
INDEX_RETRAIN_GROWTH = ANN_RETRAIN_GROWTH


def _schema(dimensions: int):
    import pyarrow as pa  # the writer's: a query process never needs pyarrow

    return pa.schema(
        [
            pa.field("chunk_id", pa.string()),
            pa.field("document_id", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dimensions)),
        ]
    )


class _LoadedOnAsk(dict):
    """A dict whose ``get`` loads what is asked for; ``d[key]`` goes through it too."""

    def __getitem__(self, document_id):
        found = self.get(document_id)
        if found is None:
            raise KeyError(document_id)
        return found


class _ByDocument(_LoadedOnAsk):
    """``{document_id: its chunk ids}``, each document's set made when it is first asked for
    (a run touches a few of the 45k documents; building every set costs seconds)."""

    def __init__(self, chunk_ids: list[str], document_ids):
        import pyarrow.compute as pc

        super().__init__()
        encoded = pc.dictionary_encode(document_ids.combine_chunks()
                                       if hasattr(document_ids, "combine_chunks") else document_ids)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        self._index = {d: i for i, d in enumerate(encoded.dictionary.to_pylist())}
        self._order = np.argsort(codes, kind="stable")
        self._bounds = np.searchsorted(codes[self._order], np.arange(len(self._index) + 1))
        self._chunk_ids = chunk_ids

    def _load(self, document_id):
        i = self._index.pop(document_id, None)
        if i is None:
            return None
        ids = {self._chunk_ids[j] for j in self._order[self._bounds[i]:self._bounds[i + 1]].tolist()}
        super().__setitem__(document_id, ids)
        return ids

    def get(self, document_id, default=None):
        if dict.__contains__(self, document_id):
            return dict.__getitem__(self, document_id)
        found = self._load(document_id)
        return default if found is None else found

    def __contains__(self, document_id):
        return dict.__contains__(self, document_id) or document_id in self._index

    def __setitem__(self, document_id, ids):
        self._index.pop(document_id, None)
        super().__setitem__(document_id, ids)


class _LazyByDocument(_LoadedOnAsk):
    """``{document_id: its chunk ids}``, read from the table for the documents asked for."""

    def __init__(self, writer: "VectorWriter"):
        super().__init__()
        self._writer = writer

    def get(self, document_id, default=None):
        if not dict.__contains__(self, document_id):
            writer = self._writer
            if not writer._all_loaded:
                writer.load_documents([document_id])
            elif writer._stored is not None and document_id in writer._stored:
                dict.__setitem__(self, document_id, set(writer._stored[document_id]))
        return dict.get(self, document_id, default)

    def __contains__(self, document_id):
        return self.get(document_id) is not None


class VectorWriter:
    """Buffers one ingest run's vector changes and applies them at commit.

    The chunk ids already stored are read for the documents a run touches, a filtered scan
    of the id columns each time (adr/0034-one-file-edit-cost.md); past :data:`LAZY_ID_QUERIES` such reads, or when
    :meth:`load_all` is called, every id is read at once."""

    LAZY_ID_QUERIES = 16

    def __init__(self, lance_dir: Path, dimensions: int, published_version: str | None,
                 ann_threshold: int = ANN_THRESHOLD, trained_rows: int | None = None):
        import lancedb

        self.lance_dir = Path(lance_dir)
        self.published_version = None if published_version is None else int(published_version)
        # The index file commit wrote (``manifest_entries``), and how: "none", "kept",
        # "delta" or "built".
        self.index_name: str | None = None
        self.index_file_action = "none"
        # This run's changes, kept for the index file's delta (None: too many to keep).
        self._run_added: list | None = []
        self._run_deleted: set[str] = set()
        self.dimensions = dimensions
        self.ann_threshold = ann_threshold
        self.ann_index: str | None = None
        # Rows the published index was trained on (the manifest's ``ann_trained_rows``).
        self.trained_rows = trained_rows
        # What commit did to the index: "none", "kept", "updated" or "trained".
        self.index_action = "none"
        self.db = lancedb.connect(str(lance_dir))
        self.table = None
        # ``ids``: the stored chunk ids read so far, as this run leaves them.
        self.by_document = _LazyByDocument(self)
        self.ids: set[str] = set()
        # Rows of the published version at start (0 without a table): the caller compares it
        # with the collection's chunk count to tell whether every chunk has its vector.
        self.start_rows = 0
        self._all_loaded = True
        self._stored = None
        self._queries = 0
        if TABLE in self.db.list_tables().tables:
            self.table = self.db.open_table(TABLE)
            if published_version is not None and self.table.version != int(published_version):
                # A run that died after writing vectors but before publishing: roll back.
                self.table.restore(int(published_version))
            self.start_rows = self.table.count_rows()
            self._all_loaded = self.start_rows == 0
        self.to_delete: set[str] = set()
        self.to_add: list[tuple[str, str, np.ndarray]] = []

    def load_documents(self, document_ids) -> None:
        """Read the stored chunk ids of these documents (each once, before the run changes it)."""
        if self._all_loaded:
            return
        todo = [d for d in dict.fromkeys(document_ids) if not dict.__contains__(self.by_document, d)]
        if not todo:
            return
        self._queries += 1
        if self._queries > self.LAZY_ID_QUERIES:
            self.load_all()
            return
        for i in range(0, len(todo), 1000):
            part = todo[i : i + 1000]
            quoted = ",".join("'" + d.replace("'", "''") + "'" for d in part)
            found = (self.table.search().where(f"document_id IN ({quoted})")
                     .select(["chunk_id", "document_id"]).limit(None).to_arrow())
            for d in part:
                dict.__setitem__(self.by_document, d, set())
            for cid, did in zip(found.column("chunk_id").to_pylist(),
                                found.column("document_id").to_pylist()):
                dict.__getitem__(self.by_document, did).add(cid)
                self.ids.add(cid)

    def load_all(self) -> None:
        """Read every stored chunk id (the two id columns, not the vectors)."""
        if self._all_loaded:
            return
        # The table may hold this run's flushed adds already, never its deletes (those wait
        # for commit); documents the run has read or changed keep their entries.
        current = self.table.search().select(["chunk_id", "document_id"]).limit(None).to_arrow()
        chunk_ids = current.column("chunk_id").to_pylist()
        self._stored = _ByDocument(chunk_ids, current.column("document_id"))
        self.ids = (set(chunk_ids) - self.to_delete) | {cid for cid, _, _ in self.to_add}
        self._all_loaded = True

    def existing_ids(self, chunk_ids, document_ids=()) -> set[str]:
        """Which of ``chunk_ids`` (of the documents ``document_ids``) have a vector. Without
        ``document_ids`` every stored id is read first."""
        if document_ids:
            self.load_documents(document_ids)
        else:
            self.load_all()
        return {c for c in chunk_ids if c in self.ids}

    def replace_document(self, document_id: str, new_rows, keep_ids) -> None:
        keep = set(keep_ids)
        old = self.by_document.get(document_id, set())
        gone = old - keep
        self.to_delete |= gone
        self.ids -= gone
        for cid, vec in new_rows:
            self.to_add.append((cid, document_id, np.asarray(vec, dtype=np.float32)))
            self.ids.add(cid)
        if self._run_added is not None:
            self._run_added.extend(self.to_add[len(self.to_add) - len(new_rows):])
            if len(self._run_added) > _RUN_KEEP_MAX:
                self._run_added = None
        dict.__setitem__(self.by_document, document_id, (old & keep) | {cid for cid, _ in new_rows})
        if len(self.to_add) >= ADD_BATCH:
            self._flush_adds()

    def _ensure_table(self):
        if self.table is None:
            self.table = self.db.create_table(TABLE, schema=_schema(self.dimensions))

    def _flush_adds(self):
        if not self.to_add:
            return
        import pyarrow as pa

        self._ensure_table()
        flat = np.stack([v for _, _, v in self.to_add]).astype(np.float32).ravel()
        batch = pa.table(
            {
                "chunk_id": [c for c, _, _ in self.to_add],
                "document_id": [d for _, d, _ in self.to_add],
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(flat), self.dimensions),
            },
            schema=_schema(self.dimensions),
        )
        self.table.add(batch)
        self.to_add = []

    def commit(self) -> int:
        self._ensure_table()
        doomed = sorted(self.to_delete)
        self._run_deleted |= self.to_delete
        for i in range(0, len(doomed), 1000):
            quoted = ",".join("'" + c.replace("'", "''") + "'" for c in doomed[i : i + 1000])
            self.table.delete(f"chunk_id IN ({quoted})")
        self.to_delete = set()
        self._flush_adds()
        self._maybe_index()
        self._write_index_file(self.table.version)
        return self.table.version

    # -- the memory-mapped index file --------------------------------------------

    def index_missing(self) -> bool:
        """Whether the published version has no index file yet (a collection ingested before
        it existed): the ingest then publishes one even when no file changed."""
        if self.published_version is None:
            return False
        return not (self.lance_dir / index_file_name(self.published_version)).is_file()

    def manifest_entries(self) -> list[tuple[str, str]]:
        """What the manifest records about the vectors after ``commit``."""
        return [("lance_version", str(self.table.version)), ("ann_index", self.ann_index or ""),
                ("ann_trained_rows", str(self.trained_rows or "")),
                ("vector_index", self.index_name or "")]

    def _write_index_file(self, version: int) -> None:
        name = index_file_name(version)
        path = self.lance_dir / name
        prev_path = (self.lance_dir / index_file_name(self.published_version)
                     if self.published_version is not None else None)
        prev = None
        if prev_path is not None and prev_path.is_file():
            try:
                prev = IndexFile(prev_path)
            except (OSError, ValueError):
                prev = None
        if version == self.published_version and prev is not None:
            self.index_name, self.index_file_action = name, "kept"
            return
        rows = self.table.count_rows()
        if prev is not None and self._run_added is not None:
            if self._write_delta(path, version, prev, rows):
                self.index_name, self.index_file_action = name, "delta"
                self._cleanup_index_files(keep={name, self._base_of(name)})
                return
        centroids = trained = None
        if prev is not None:
            base = prev if prev.header.get("kind") == "base" else IndexFile(
                self.lance_dir / prev.header["base"])
            if "centroids" in base.arrays and rows < INDEX_RETRAIN_GROWTH * base.header.get("trained_rows", rows):
                centroids, trained = np.array(base["centroids"]), base.header.get("trained_rows")
        build_index_from_table(self.lance_dir, self.table, version, centroids=centroids,
                               trained_rows=trained)
        self.index_name, self.index_file_action = name, "built"
        self._cleanup_index_files(keep={name})

    def _base_of(self, name: str) -> str:
        f = IndexFile(self.lance_dir / name)
        return f.header.get("base", name)

    def _write_delta(self, path: Path, version: int, prev: IndexFile, rows: int) -> bool:
        """Write a delta on the previous file's base when the changes since it are few."""
        if prev.header.get("kind") == "delta":
            base_name = prev.header["base"]
            base = IndexPart(IndexFile(self.lance_dir / base_name))
            delta = IndexPart(prev)
            deleted = set(prev["deleted"].tolist())
            names = delta.doc_names()
            carried = [(cid, names[delta.docs[i]], i) for i, cid in enumerate(delta.chunk_ids())]
        else:
            base_name = index_file_name(self.published_version)
            base = IndexPart(prev)
            delta, deleted, carried = None, set(), []
        gone = self._run_deleted
        limit = max(INDEX_DELTA_ROWS, INDEX_DELTA_FRACTION * base.rows)
        added = [(c, d, delta.vectors[i]) for c, d, i in carried if c not in gone]
        added += [(c, d, v) for c, d, v in self._run_added]
        if len(added) > limit:
            return False
        if gone:
            position = {cid: i for i, cid in enumerate(base.chunk_ids())}
            deleted |= {position[c] for c in gone if c in position}
        if len(added) + len(deleted) > limit:
            return False
        # The delta must describe exactly the table LanceDB now holds.
        if base.rows - len(deleted) + len(added) != rows:
            return False
        matrix = (np.stack([v for _, _, v in added]) if added
                  else np.zeros((0, self.dimensions), dtype=np.float32))
        write_delta_index(path, version, base_name, np.asarray(sorted(deleted), dtype=np.int64),
                          [c for c, _, _ in added], [d for _, d, _ in added], matrix)
        return True

    def _cleanup_index_files(self, keep: set[str]) -> None:
        """Remove index files no manifest can name any more: all but this run's (and its base)
        and the published one (a reader holding that version may not have opened it yet)."""
        folder = self.lance_dir / INDEX_SUBDIR
        if self.published_version is not None:
            published = index_file_name(self.published_version)
            keep = keep | {published}
            try:
                keep.add(self._base_of(published))
            except (OSError, ValueError):
                pass
        for entry in folder.iterdir() if folder.is_dir() else ():
            if f"{INDEX_SUBDIR}/{entry.name}" not in keep:
                try:
                    entry.unlink()
                except OSError:
                    pass

    def _maybe_index(self) -> None:
        """Keep the ANN index current without retraining it for every run."""
        from datetime import timedelta

        from lancedb.index import IvfHnswSq

        rows = self.table.count_rows()
        indices = self.table.list_indices()
        if rows < self.ann_threshold:
            self.ann_index = None
            self.trained_rows = None
            if indices:
                self.table.drop_index(indices[0].name)
                self.index_action = "dropped"
            return
        stats = self.table.index_stats(indices[0].name) if indices else None
        self.ann_index = ANN_INDEX
        if self.trained_rows is None and stats is not None:
            self.trained_rows = stats.num_indexed_rows  # a file from before the record
        if stats is not None and self.trained_rows and rows < ANN_RETRAIN_GROWTH * self.trained_rows:
            if stats.num_unindexed_rows <= max(ANN_UNINDEXED_ROWS, ANN_UNINDEXED_FRACTION * rows):
                self.index_action = "kept"
                return
            # New rows go into the trained partitions; compaction comes with it.
            self.table.optimize(cleanup_older_than=timedelta(days=_KEEP_VERSIONS_DAYS))
            self.index_action = "updated"
            return
        self.table.create_index("vector", config=IvfHnswSq(distance_type="cosine"), replace=True)
        self.trained_rows = rows
        self.index_action = "trained"
