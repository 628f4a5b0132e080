"""The collection file format: stamps, tables, and read-only opening.

See docs/collection-format.md. One place for the DDL and the stamps.
"""

import os
import sqlite3
from dataclasses import dataclass
import urllib.parse
from pathlib import Path

from ..errors import NotACollection, SchemaMismatch

# 'GKDS' as a big-endian integer: identifies a groundkit collection without writing to it.
APPLICATION_ID = 0x474B4453
SCHEMA_VERSION = 1

# Keeps chunks_fts in step with rows inserted by hand. Ingest lifts it for its run and indexes
# the new rows in one statement, which is several times faster than a trigger per row.
FTS_INSERT_TRIGGER = """
CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, content, heading) VALUES (new.id, new.content, new.heading);
END;
"""

DDL = """
CREATE TABLE documents (
    document_id TEXT PRIMARY KEY,
    source TEXT NOT NULL UNIQUE,
    source_class TEXT NOT NULL,
    extractor TEXT NOT NULL,
    extractor_version TEXT NOT NULL,
    title TEXT,
    content_hash TEXT NOT NULL,
    file_hash TEXT NOT NULL,
    char_count INTEGER NOT NULL,
    line_count INTEGER NOT NULL,
    page_count INTEGER,
    chunk_count INTEGER NOT NULL,
    acl TEXT,
    generation INTEGER NOT NULL,
    ingested_at TEXT NOT NULL,
    encoding TEXT,
    source_size INTEGER,
    source_mtime_ns INTEGER
);

CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    chunk_id TEXT NOT NULL UNIQUE,
    document_id TEXT NOT NULL REFERENCES documents(document_id) ON DELETE CASCADE,
    chunk_index INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    line_start INTEGER NOT NULL,
    line_end INTEGER NOT NULL,
    page_start INTEGER,
    page_end INTEGER,
    heading TEXT NOT NULL DEFAULT '',
    content TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    UNIQUE (document_id, chunk_index)
);
-- UNIQUE (document_id, chunk_index) also serves lookups by document_id.

CREATE VIRTUAL TABLE chunks_fts USING fts5(
    content, heading, content="chunks", content_rowid="id", tokenize='porter unicode61'
);
CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, content, heading)
    VALUES ('delete', old.id, old.content, old.heading);
END;

-- Per-chunk term ids and frequencies, kept so the BM25 postings can be
-- rebuilt after an incremental ingest without re-tokenising every chunk.
CREATE TABLE bm25_chunk_terms (
    id INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE,
    length INTEGER NOT NULL,
    term_ids BLOB NOT NULL,
    term_freqs BLOB NOT NULL
);
CREATE TABLE bm25_vocab (
    term TEXT PRIMARY KEY,
    term_id INTEGER NOT NULL UNIQUE,
    doc_freq INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
-- Precomputed BM25 weight of each (term, chunk): a query is a sum of lookups.
CREATE TABLE bm25_postings (
    term_id INTEGER PRIMARY KEY,
    chunk_ids BLOB NOT NULL,
    weights BLOB NOT NULL
);

CREATE TABLE groundkit_manifest (
    key TEXT PRIMARY KEY,
    value TEXT
) WITHOUT ROWID;
"""

# CJK text for Datasette's ?_search= (adr/0022-cjk-search.md): FTS5's unicode61 reads a
# run of Han/Kana/Hangul as one token, so each chunk holding such text gets a row of its runs'
# character bigrams, space-separated, indexed by an FTS5 table of its own. Rows follow their
# chunk (a foreign-key cascade); the triggers keep the index in step, deletes included.
CJK_DDL = """
CREATE TABLE IF NOT EXISTS chunks_cjk (
    id INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE,
    chunk_id TEXT NOT NULL,
    bigrams TEXT NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_cjk_fts USING fts5(
    bigrams, content="chunks_cjk", content_rowid="id", tokenize='unicode61'
);
CREATE TRIGGER IF NOT EXISTS chunks_cjk_ai AFTER INSERT ON chunks_cjk BEGIN
    INSERT INTO chunks_cjk_fts(rowid, bigrams) VALUES (new.id, new.bigrams);
END;
CREATE TRIGGER IF NOT EXISTS chunks_cjk_ad AFTER DELETE ON chunks_cjk BEGIN
    INSERT INTO chunks_cjk_fts(chunks_cjk_fts, rowid, bigrams) VALUES ('delete', old.id, old.bigrams);
END;
"""

# Tables people browse in Datasette; the others are machinery.
PUBLIC_TABLES = ("documents", "chunks", "chunks_cjk")
INTERNAL_TABLES = ("bm25_chunk_terms", "bm25_vocab", "bm25_postings", "groundkit_manifest")


def create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript("BEGIN;" + DDL + FTS_INSERT_TRIGGER + CJK_DDL + "COMMIT;")  # one transaction
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def has_encoding_column(conn: sqlite3.Connection) -> bool:
    """Collections written before text encodings were recorded lack ``documents.encoding``."""
    return any(row[1] == "encoding" for row in conn.execute("PRAGMA table_info(documents)"))


def add_encoding_column(conn: sqlite3.Connection) -> None:
    """Bring an older collection's copy up to date (NULL: chosen by the extractor's rule)."""
    if not has_encoding_column(conn):
        conn.execute("ALTER TABLE documents ADD COLUMN encoding TEXT")


STAT_COLUMNS = ("source_size", "source_mtime_ns")


def has_stat_columns(conn: sqlite3.Connection) -> bool:
    """Collections written before stale-hit checks lack the source's recorded size and mtime."""
    names = {row[1] for row in conn.execute("PRAGMA table_info(documents)")}
    return set(STAT_COLUMNS) <= names


def add_stat_columns(conn: sqlite3.Connection) -> None:
    """Additive, NULL for existing rows (their hits say ``source_changed: null``)."""
    names = {row[1] for row in conn.execute("PRAGMA table_info(documents)")}
    for column in STAT_COLUMNS:
        if column not in names:
            conn.execute(f"ALTER TABLE documents ADD COLUMN {column} INTEGER")


def add_cjk_tables(conn: sqlite3.Connection) -> None:
    """Older collections' copies gain the CJK search table (filled as documents are written)."""
    conn.executescript(CJK_DDL)


def suspend_fts_trigger(conn: sqlite3.Connection) -> None:
    conn.execute("DROP TRIGGER IF EXISTS chunks_ai")


def index_new_chunks(conn: sqlite3.Connection, first_id: int) -> None:
    """Add chunks with row id >= ``first_id`` to ``chunks_fts`` and restore the trigger."""
    conn.execute(
        "INSERT INTO chunks_fts(rowid, content, heading) "
        "SELECT id, content, heading FROM chunks WHERE id >= ?",
        (first_id,),
    )
    conn.execute(FTS_INSERT_TRIGGER)


def immutable_uri(path: Path) -> str:
    quoted = urllib.parse.quote(str(Path(path).resolve()))
    return f"file:{quoted}?mode=ro&immutable=1"


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open without locking and without ever writing (no -wal, no -shm, no journal)."""
    conn = sqlite3.connect(immutable_uri(path), uri=True, check_same_thread=False)
    return conn


def read_stamp(conn: sqlite3.Connection) -> tuple[int, int]:
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    return app_id, version


def is_collection_file(path: Path) -> bool:
    """True when ``path`` is a SQLite file carrying our application id (read immutably)."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError:
        return False
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return False
    # The application id lives at byte offset 68 of the header, big-endian.
    return int.from_bytes(header[68:72], "big") == APPLICATION_ID


def check_stamp(conn: sqlite3.Connection) -> None:
    app_id, version = read_stamp(conn)
    if app_id != APPLICATION_ID:
        raise NotACollection("not a groundkit collection")
    if version != SCHEMA_VERSION:
        raise SchemaMismatch(
            f"collection schema version {version} is not supported (expected {SCHEMA_VERSION})"
        )


def read_manifest(conn: sqlite3.Connection) -> dict:
    return dict(conn.execute("SELECT key, value FROM groundkit_manifest").fetchall())


@dataclass(frozen=True)
class FileIdentity:
    """Cheap fingerprint of the published file: a rename-publish changes the inode."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> "FileIdentity":
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
