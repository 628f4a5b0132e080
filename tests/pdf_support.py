"""A small PDF writer for tests: pages of text lines in Helvetica, nothing else.

Written here so the PDF tests need no PDF-producing dependency: the files are plain
PDF 1.4 (one content stream per page, a standard font, a correct xref table) that
pypdf and pdfium both read.
"""

from __future__ import annotations

FONT_SIZE = 12
LEADING = 18
LEFT = 72
TOP = 720
PAGE = (612, 792)  # US Letter, in points


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[list[str]], *, rotate: dict[int, int] | None = None,
             size: tuple[int, int] = PAGE) -> bytes:
    """A PDF with one page per list of lines (ASCII text), set from the top left.

    ``rotate`` maps a 0-based page number to its /Rotate value (90, 180, 270).
    """
    rotate = rotate or {}
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)  # object numbers start at 1

    catalog = add(b"")  # filled in below
    tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    kids = []
    for number, lines in enumerate(pages):
        ops = [f"BT /F1 {FONT_SIZE} Tf {LEADING} TL {LEFT} {size[1] - (PAGE[1] - TOP)} Td"]
        for i, line in enumerate(lines):
            ops.append(("" if i == 0 else "T* ") + f"({_escape(line)}) Tj")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        extra = f" /Rotate {rotate[number]}" if number in rotate else ""
        kids.append(add(
            f"<< /Type /Page /Parent {tree} 0 R /MediaBox [0 0 {size[0]} {size[1]}]"
            f" /Resources << /Font << /F1 {font} 0 R >> >> /Contents {content} 0 R{extra} >>"
            .encode()))
    objects[catalog - 1] = f"<< /Type /Catalog /Pages {tree} 0 R >>".encode()
    objects[tree - 1] = (f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}]"
                         f" /Count {len(kids)} >>").encode()
    return write_pdf(objects, catalog)


def write_pdf(objects: list[bytes], catalog: int) -> bytes:
    """A PDF of the given objects (numbered from 1) with a correct xref table."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, catalog, xref)
    return bytes(out)


def pdf_stream(dictionary: bytes, data: bytes) -> bytes:
    """A stream object's body: ``dictionary`` entries plus /Length, then ``data``."""
    return b"<< " + dictionary + b" /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"
