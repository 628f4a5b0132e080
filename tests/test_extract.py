import pypdf
import pytest

from groundkit_datasette.indexing.chunking import chunk_text
from groundkit_datasette.indexing.extract import (
    HTML_EXTRACTOR_VERSION,
    PDF_PAGE_SEPARATOR,
    Extracted,
    Skipped,
    extract_bytes,
    extract_file,
    extractor_available,
    page_for_offset,
)


def make_pdf(pages: list[list[str]]) -> bytes:
    """A minimal valid PDF: one Helvetica text line per string, one page per list."""
    n = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            esc = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops.append(f"({esc}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def test_markdown(tmp_path):
    text = "Intro\n\n```\n# not title\n```\n\n## Second\n\n# Real *Title* #\n\nBody\r\n"
    e = extract_file(write(tmp_path, "doc.md", text))
    assert e == Extracted(text, "Real *Title*", "markdown", "text", "1", encoding="utf-8")


def test_markdown_bom_stripped_and_crlf_kept(tmp_path):
    e = extract_file(write(tmp_path, "doc.markdown", b"\xef\xbb\xbf# T\r\n\r\nline\r\n"))
    assert e.text == "# T\r\n\r\nline\r\n"
    assert e.title == "T"


def test_plain_text_verbatim(tmp_path):
    raw = "  héllo\tworld \r\nsecond\rthird\n\n\n"
    for name in ("notes.txt", "README", "data.unknownext"):
        e = extract_file(write(tmp_path, name, raw))
        assert e.text == raw
        assert (e.source_class, e.extractor, e.title) == ("text", "text", None)


def test_rst(tmp_path):
    text = "Not a title\n\n=========\nThe Title\n=========\n\nSection\n-------\n\ntext\n"
    e = extract_file(write(tmp_path, "doc.rst", text))
    assert (e.source_class, e.title, e.text) == ("rst", "The Title", text)


@pytest.mark.parametrize("name", ["a.py", "b.JS", "c.rs", "d.toml", "e.yml", "Makefile", "f.sql"])
def test_code(tmp_path, name):
    e = extract_file(write(tmp_path, name, "# comment\nx = 1\n"))
    assert (e.source_class, e.title, e.text) == ("code", None, "# comment\nx = 1\n")


def test_html(tmp_path):
    html = """<!DOCTYPE html>
<html><head><title>  Fish &amp; Chips </title>
<style>body { color: red }</style>
<script>document.write("<p>hidden</p>")</script>
<meta charset="utf-8"></head>
<body>
<h1>Menu</h1>
<p>Cod&nbsp;and   <em>chips</em>
 &mdash; &lt;fresh&gt;, caf&eacute;.</p>
<ul><li>One</li><li>Two</li></ul>
<noscript>enable js</noscript>
<pre>  keep
    indent</pre>
<div>Line<br>break</div>
</body></html>"""
    e = extract_file(write(tmp_path, "page.html", html))
    assert e.source_class == "html" and e.extractor == "html"
    assert e.extractor_version == HTML_EXTRACTOR_VERSION
    assert e.title == "Fish & Chips"
    assert e.text == (
        "Menu\n\nCod and chips — <fresh>, café.\n\nOne\nTwo\n\n  keep\n    indent\n\nLine\nbreak"
    )
    assert "hidden" not in e.text and "color" not in e.text and "enable js" not in e.text


def test_html_title_falls_back_to_h1(tmp_path):
    e = extract_file(write(tmp_path, "x.htm", "<body><h1> The  <b>Head</b> </h1><p>x</p>"))
    assert e.title == "The Head"
    assert e.text == "The Head\n\nx"


def test_html_legacy_charset(tmp_path):
    data = '<meta charset="iso-8859-1"><p>caf\xe9</p>'.encode("latin-1")
    assert extract_file(write(tmp_path, "l.html", data)).text == "café"


def test_pdf_two_pages(tmp_path):
    path = write(tmp_path, "doc.pdf", make_pdf([["Hello page one.", "More (text)."], ["Second page here."]]))
    e = extract_file(path)
    assert (e.source_class, e.extractor, e.extractor_version) == ("pdf", "pypdf", pypdf.__version__)
    assert len(e.page_starts) == 2 and e.page_starts[0] == 0
    first = e.text[: e.page_starts[1]]
    second = e.text[e.page_starts[1] :]
    assert "Hello page one." in first and "More (text)." in first
    assert first.endswith(PDF_PAGE_SEPARATOR)
    assert "Second page here." in second and "Hello" not in second
    assert page_for_offset(e.page_starts, e.text.index("Second")) == 2
    assert page_for_offset(e.page_starts, 0) == 1
    chunks = chunk_text(e.text, source_class="pdf")
    assert [page_for_offset(e.page_starts, c.start) for c in chunks] == [1, 2]
    assert extractor_available(e.extractor, e.extractor_version)


def test_binary_skipped(tmp_path):
    data = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    for name in ("blob", "blob.txt", "blob.weird", "blob.md"):
        with pytest.raises(Skipped) as info:
            extract_file(write(tmp_path, name, data))
        assert info.value.reason == "binary"


def test_other_skips(tmp_path):
    with pytest.raises(Skipped) as info:
        extract_file(write(tmp_path, "image.png", b"\x89PNG"))
    assert info.value.reason == "unsupported type"
    with pytest.raises(Skipped) as info:
        extract_file(write(tmp_path, "empty.md", " \n\t\n"))
    assert info.value.reason == "empty"
    with pytest.raises(Skipped) as info:
        extract_file(write(tmp_path, "big.txt", "x" * 100), max_bytes=10)
    assert info.value.reason == "too large"
    with pytest.raises(Skipped) as info:
        extract_bytes(b"%PDF-1.4 garbage", ".pdf")
    assert info.value.reason == "unreadable pdf"
    with pytest.raises(Skipped) as info:
        extract_bytes(make_pdf([[]]), ".pdf")
    assert info.value.reason == "no text layer (scanned?)"  # pages, but no text on any


@pytest.mark.parametrize(
    "data,encoding,text",
    [
        ("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1"), "cp1252", "caf\xe9 cr\xe8me br\xfbl\xe9e\n"),
        ("\u201cquoted\u201d \u20ac5 \u2014 na\xefve\n".encode("cp1252"), "cp1252",
         "\u201cquoted\u201d \u20ac5 \u2014 na\xefve\n"),
        # 0x81 is undefined in Windows-1252: Latin-1 decodes every byte.
        (b"caf\xe9 \x81 end\n", "iso8859-1", "caf\xe9 \x81 end\n"),
        ("plain caf\xe9\n".encode("utf-8"), "utf-8", "plain caf\xe9\n"),
    ],
)
def test_text_in_other_encodings_is_decoded_by_the_fixed_rule(tmp_path, data, encoding, text):
    """Latin-1 and cp1252 files were dropped as "not utf-8 text"; now decoded, codec recorded."""
    e = extract_file(write(tmp_path, "note.txt", data))
    assert (e.text, e.encoding) == (text, encoding)
    # Forced to the recorded codec, the same bytes give the same text (verification's path).
    assert extract_bytes(data, ".txt", encoding=encoding).text == text


def test_a_recorded_encoding_is_used_rather_than_chosen_again():
    """Once recorded as cp1252, bytes that are now valid UTF-8 still decode as cp1252."""
    data = "caf\xe9".encode("utf-8")
    assert extract_bytes(data, ".txt").text == "caf\xe9"
    assert extract_bytes(data, ".txt", encoding="cp1252").text == "caf\xc3\xa9"
    with pytest.raises(Skipped):
        extract_bytes("caf\xe9".encode("latin-1"), ".txt", encoding="utf-8")


def test_html_without_a_usable_charset_falls_back_to_cp1252():
    data = "<html><body><p>\u201cCaf\xe9\u201d</p></body></html>".encode("cp1252")
    e = extract_bytes(data, ".html")
    assert (e.text, e.encoding) == ("\u201cCaf\xe9\u201d", "cp1252")


def test_extract_bytes_matches_file(tmp_path):
    data = "# Title\n\ntext\n".encode()
    assert extract_bytes(data, ".md") == extract_file(write(tmp_path, "t.md", data))
    assert extract_bytes(data, "md") == extract_bytes(data, ".MD")


@pytest.mark.parametrize(
    "name,data",
    [
        ("a.md", "# T\n\nbody ✓\r\n"),
        ("a.html", "<title>t</title><p>a <b>b</b></p><script>x</script>"),
        ("a.pdf", make_pdf([["one"], ["two"]])),
        ("a.txt", "plain\n"),
    ],
)
def test_deterministic(tmp_path, name, data):
    path = write(tmp_path, name, data)
    assert extract_file(path) == extract_file(path)


def test_extractor_available():
    assert extractor_available("text", "1")
    assert not extractor_available("text", "0")
    assert extractor_available("html", HTML_EXTRACTOR_VERSION)
    assert not extractor_available("html", HTML_EXTRACTOR_VERSION + "x")
    assert extractor_available("pypdf", pypdf.__version__)
    assert not extractor_available("pypdf", "0.0.1")
    assert not extractor_available("tesseract", "5")
