"""EPUB e-books: the spine's XHTML chapters in reading order, each read by the HTML extractor
under a ``#`` heading (its title, else "Section N"). Parsed in an isolation worker (adr/0050),
every chapter counted before it is parsed. Its version names the HTML extractor's, whose text
each chapter is."""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

from .base import Budget, Extraction, Extractor, Skipped, collapse
from .html_text import HTML_EXTRACTOR_VERSION, html_text
from .packages import (DC, FORMAT_EXTRACTOR_VERSION, Outline, packaged, q, read_xml,
                       scan_member)

__all__ = ["EPUB"]


def _version() -> str:
    return f"{FORMAT_EXTRACTOR_VERSION}/html-{HTML_EXTRACTOR_VERSION}"


def extract_epub(data: bytes, *, encoding: str | None, budget) -> Extraction:
    return packaged(data, budget, "epub", _read_epub, _version)


_OPF = "http://www.idpf.org/2007/opf"
_CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
_XHTML_TYPES = {"application/xhtml+xml", "text/html"}


def _read_epub(data: bytes, archive, budget: Budget) -> tuple[Outline, str | None]:
    container = read_xml(archive, "META-INF/container.xml", budget)
    rootfile = container.find(f".//{q(_CONTAINER, 'rootfile')}") if container is not None else None
    opf_path = rootfile.get("full-path") if rootfile is not None else None
    package = read_xml(archive, opf_path, budget) if opf_path else None
    if package is None:
        raise Skipped("unreadable epub")
    opf_dir = posixpath.dirname(opf_path)
    items = {
        item.get("id"): (item.get("href") or "", item.get("media-type") or "")
        for item in package.iter(q(_OPF, "item"))
    }
    out = Outline()
    for number, ref in enumerate(package.iter(q(_OPF, "itemref")), 1):
        href, media_type = items.get(ref.get("idref"), ("", ""))
        if media_type not in _XHTML_TYPES or not href:
            continue
        name = posixpath.normpath(posixpath.join(opf_dir, unquote(href.split("#", 1)[0])))
        try:
            info = archive.getinfo(name)
        except KeyError:
            continue  # a spine entry the package does not hold
        scan_member(archive, info, budget, html=True)
        chapter = archive.read(info)
        try:
            text, chapter_title, _used = html_text(chapter, None)
        except Skipped:
            continue
        if not text.strip():
            continue
        heading = collapse(chapter_title or f"Section {number}")
        first, _sep, rest = text.partition("\n\n")
        if collapse(first) == heading:
            text = rest  # the chapter's own <h1> repeats its title
        out.heading(1, heading)
        out.paragraph(text)
    title_node = package.find(f".//{q(DC, 'title')}")
    title = collapse(title_node.text) if title_node is not None and title_node.text else None
    return out, (title or None)


EPUB = Extractor("epub", _version, (".epub",), "markdown", extract_epub, isolated=True)
