"""The built-in extractors, registered through the hook like any plugin's (adr/0057)."""

from ...hookspecs import hookimpl
from .epub import EPUB
from .html_text import HTML
from .markup import MARKDOWN, RST
from .odf import ODT
from .office import DOCX, PPTX
from .pdf import PDF
from .spreadsheet import XLSX
from .text import CODE, PLAIN

BUILTIN_EXTRACTORS = (PLAIN, MARKDOWN, RST, CODE, HTML, PDF, DOCX, PPTX, XLSX, ODT, EPUB)


@hookimpl
def register_extractors(register):
    for extractor in BUILTIN_EXTRACTORS:
        register(extractor)
