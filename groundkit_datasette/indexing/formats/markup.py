"""Markdown (with YAML front matter) and reStructuredText: decoded as text, titled by their
headings. Both are read by the "text" extractor, so their identity is plain text's."""

from __future__ import annotations

from ..chunking import find_headings
from .base import Extraction, Extractor
from .text import TEXT_EXTRACTOR_VERSION, decoded

__all__ = ["MARKDOWN", "RST", "front_matter_title"]


def _markdown(data: bytes, *, encoding: str | None, budget) -> Extraction:
    """Titled by the first level-1 heading, else the front matter's ``title:``."""
    plain = decoded(data, encoding)
    title = None
    for h in find_headings(plain.text, "markdown"):
        if h.level == 1 and h.title:
            title = h.title
            break
    else:
        title = front_matter_title(plain.text)
    return Extraction(plain.text, title, encoding=plain.encoding)


def front_matter_title(text: str) -> str | None:
    """The ``title:`` of a Markdown file's YAML front matter, whitespace collapsed."""
    from ..access_lists import front_matter

    try:
        matter = front_matter(text.lstrip("\ufeff"))
    except Exception:  # front matter that is not YAML gives no title (and stays text)
        return None
    value = matter.get("title") if matter else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return " ".join(value.split()) or None if isinstance(value, str) else None


def _rst(data: bytes, *, encoding: str | None, budget) -> Extraction:
    """Titled by the first heading."""
    plain = decoded(data, encoding)
    title = next((h.title for h in find_headings(plain.text, "rst")), None)
    return Extraction(plain.text, title, encoding=plain.encoding)


MARKDOWN = Extractor("text", TEXT_EXTRACTOR_VERSION,
                     (".md", ".markdown", ".mdown", ".mkd", ".mdx"), "markdown", _markdown)
RST = Extractor("text", TEXT_EXTRACTOR_VERSION, (".rst", ".rest"), "rst", _rst)
