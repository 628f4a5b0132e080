"""Plain text and source code, and the fixed rule every text format decodes by.

Text that is not UTF-8 is decoded by a fixed rule, not guessed by a detector: a BOM (UTF-8 or
UTF-16), else UTF-8, else Windows-1252, else Latin-1 (which decodes any bytes). The encoding
used is recorded per document, and verification decodes with the recorded one, so the same
bytes always give the same text; text is kept verbatim (no newline normalisation, only a BOM
removed) because citations are offsets into it (adr/0012-text-encodings.md).
"""

from __future__ import annotations

import codecs

from .base import Extraction, Extractor, Skipped

__all__ = ["CODE", "PLAIN", "TEXT_EXTRACTOR_VERSION", "decode", "detect_text",
           "utf8_or_single_byte"]

# Shared by every format the "text" extractor reads (plain, Markdown, reStructuredText, code).
TEXT_EXTRACTOR_VERSION = "1"

_CONTROL_BYTES = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}

UTF_8 = "utf-8"
UTF_16 = "utf-16"
CP1252 = "cp1252"
LATIN_1 = "iso8859-1"  # codecs' own name for Latin-1


def _looks_binary(data: bytes) -> bool:
    sample = data[:8192]
    if not sample:
        return False
    controls = sum(1 for b in sample if b in _CONTROL_BYTES)
    return controls * 20 > len(sample)


def detect_text(data: bytes) -> str:
    """The codec for a text file's bytes, by the fixed rule in the module docstring."""
    if data.startswith(codecs.BOM_UTF8):
        return UTF_8
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return UTF_16
    if b"\x00" in data:
        raise Skipped("binary")
    return utf8_or_single_byte(data)


def utf8_or_single_byte(data: bytes) -> str:
    try:
        data.decode("utf-8")
        return UTF_8
    except UnicodeDecodeError:
        pass
    if _looks_binary(data):
        raise Skipped("binary")
    try:
        data.decode(CP1252)  # leaves five bytes undefined; Latin-1 decodes those too
        return CP1252
    except UnicodeDecodeError:
        return LATIN_1


def decode(data: bytes, encoding: str) -> str:
    """Decode with ``encoding`` exactly (a leading BOM removed); Skipped if it does not fit."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise Skipped("unknown encoding") from None
    if name == UTF_8 and data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    elif name != UTF_16 and b"\x00" in data:
        raise Skipped("binary")
    try:
        text = data.decode(name)  # utf-16 consumes its BOM
    except UnicodeDecodeError:
        raise Skipped("binary" if _looks_binary(data) else f"not {name} text") from None
    if "\x00" in text:
        raise Skipped("binary")
    return text


def decoded(data: bytes, encoding: str | None) -> Extraction:
    """The text by the recorded ``encoding``, or by the fixed rule; no title."""
    used = encoding or detect_text(data)
    return Extraction(decode(data, used), encoding=used)


def _plain(data: bytes, *, encoding: str | None, budget) -> Extraction:
    return decoded(data, encoding)


_CODE_SUFFIXES = (
    ".py", ".pyi", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".c", ".h",
    ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".rs", ".go", ".java",
    ".kt", ".kts", ".scala", ".swift", ".m", ".mm", ".cs", ".fs", ".rb",
    ".php", ".pl", ".pm", ".lua", ".r", ".jl", ".hs", ".ml", ".mli",
    ".ex", ".exs", ".erl", ".clj", ".dart", ".zig", ".nim", ".vue",
    ".svelte", ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".cmd",
    ".toml", ".yaml", ".yml", ".json", ".jsonl", ".ini", ".cfg", ".conf",
    ".sql", ".css", ".scss", ".sass", ".less", ".xml", ".proto",
    ".graphql", ".gql", ".tf", ".cmake", ".mk", ".gradle", ".dockerfile",
    ".tex", ".bib", ".csv", ".tsv",
)
_CODE_NAMES = (
    "makefile", "gnumakefile", "dockerfile", "containerfile", "cmakelists.txt",
    "rakefile", "gemfile", "justfile", "vagrantfile", "procfile",
)

# Also what the dispatcher reads a file with when no extractor claims its suffix.
PLAIN = Extractor("text", TEXT_EXTRACTOR_VERSION, (".txt", ".text", ".log"), "text", _plain)
CODE = Extractor("text", TEXT_EXTRACTOR_VERSION, _CODE_SUFFIXES, "code", _plain,
                 file_names=_CODE_NAMES)
