"""Excel workbooks (OOXML .xlsx): each sheet a ``# Sheet "name"`` heading over its rows, cells
joined by " | ", values as openpyxl reads them. Parsed in an isolation worker (adr/0050)."""

from __future__ import annotations

import datetime
import posixpath
from xml.parsers import expat

from .base import Budget, Extraction, Extractor, Skipped, collapse, over
from .packages import (SCAN_BYTES, Outline, forbid_entities, library_version, packaged,
                       read_xml)

__all__ = ["XLSX", "cell_text", "read_xlsx"]


def _version() -> str:
    return library_version("openpyxl")


def extract_xlsx(data: bytes, *, encoding: str | None, budget) -> Extraction:
    return packaged(data, budget, "xlsx", read_xlsx, _version)


def cell_text(value) -> str:
    """A spreadsheet value as text, the same way every time."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, datetime.datetime) and value.time() == datetime.time(0):
        return value.date().isoformat()  # a date cell: Excel stores dates as midnight datetimes
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


# Spreadsheets are streamed here rather than read with openpyxl's read-only mode, which pads
# every row to its last cell's column (a row holding one cell in column XFD became 16,384
# values) and holds the shared strings whole. The values are what openpyxl 3.1's reader made
# of the same XML (its date and number-format rules are used as they are), so the text is as
# before and the extractor keeps its version (tests/test_extract_budget.py compares the two).
_XL_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_XL_REL_ID = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
_XL_ROW = f"{_XL_MAIN} row"
_XL_VALUE = f"{_XL_MAIN} v"
_XL_INLINE = f"{_XL_MAIN} is"
_XL_STRING = f"{_XL_MAIN} si"
_XL_WORKBOOK_TYPES = (  # as openpyxl looks for the workbook part, in this order
    "application/vnd.ms-excel.template.macroEnabled.main+xml",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml",
    "application/vnd.ms-excel.sheet.macroEnabled.main+xml",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
)
_XL_STRINGS_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"


def _local(tag: str) -> str:
    """An element's name without its namespace (ElementTree's ``{ns}name``, expat's ``ns name``)."""
    return tag.rpartition("}")[2].rpartition(" ")[2]


class _RichText:
    """What openpyxl's ``Text.content`` makes of an ``<si>`` or ``<is>``: the text of its last
    ``<t>`` child, then of each ``<r>`` run's last ``<t>`` (children matched by local name)."""

    __slots__ = ("plain", "runs")

    def __init__(self) -> None:
        self.plain: str | None = None
        self.runs: list = []

    def content(self) -> str:
        parts = [self.plain] if self.plain is not None else []
        return "".join(parts + [t for t in self.runs if t is not None])


class _XMLStream:
    """One member fed to expat in pieces, its elements counted against the budget. The text
    of an element before its first child (ElementTree's ``.text``) is gathered on request."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.depth = 0
        self.elements = 0
        self.gathering = False
        self.gather_depth = 0
        self.parts: list[str] = []

    def run(self, archive, name: str) -> None:
        parser = expat.ParserCreate(namespace_separator=" ")
        parser.buffer_text = True
        parser.EntityDeclHandler = forbid_entities
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._text
        with archive.open(name) as member:
            while True:
                chunk = member.read(SCAN_BYTES)
                parser.Parse(chunk, not chunk)
                self.budget.add_elements(self.elements)
                self.elements = 0
                self.checkpoint()
                if not chunk:
                    return

    def gather(self) -> None:
        self.gathering, self.gather_depth, self.parts = True, self.depth, []

    def _start(self, name, attrs):
        self.depth += 1
        self.elements += 1
        self.gathering = False  # a child: the text gathered is what came before it
        self.start(name, attrs)

    def _end(self, name):
        self.gathering = False
        self.end(name)
        self.depth -= 1

    def _text(self, data):
        if self.gathering:
            self.parts.append(data)

    def gathered(self) -> str | None:
        """At the end of the element ``gather`` was called in: its text, or None."""
        return "".join(self.parts) if self.parts else None

    def checkpoint(self) -> None:
        """Between pieces: where a subclass checks what it has built against the budget."""

    def rich_start(self, rich: _RichText, base: int, name) -> None:
        """An element inside an ``<si>``/``<is>`` at depth ``base``."""
        level = self.depth - base
        if level == 1:
            local = _local(name)
            if local == "t":
                self.rich_target = 0
                self.gather()
            elif local == "r":
                rich.runs.append(None)
                self.in_run = True
        elif level == 2 and self.in_run and _local(name) == "t":
            self.rich_target = 1
            self.gather()

    def rich_end(self, rich: _RichText, base: int) -> None:
        level = self.depth - base
        if self.rich_target is not None and self.depth == self.gather_depth:
            if self.rich_target == 0:
                rich.plain = self.gathered()
            else:
                rich.runs[-1] = self.gathered()
            self.rich_target = None
        if level == 1:
            self.in_run = False

    in_run = False
    rich_target = None


class _SharedStrings(_XMLStream):
    """xl/sharedStrings.xml as openpyxl's ``read_string_table`` read it, counted as text."""

    def __init__(self, budget: Budget):
        super().__init__(budget)
        self.strings: list[str] = []
        self.base = 0
        self.rich: _RichText | None = None
        self.chars = 0

    def start(self, name, attrs):
        if self.rich is not None:
            self.rich_start(self.rich, self.base, name)
        elif name == _XL_STRING:
            self.base, self.rich = self.depth, _RichText()

    def end(self, name):
        if self.rich is None:
            return
        if self.depth == self.base:
            text = self.rich.content().replace("x005F_", "")
            self.strings.append(text)
            self.chars += len(text)
            self.rich = None
        else:
            self.rich_end(self.rich, self.base)

    def checkpoint(self) -> None:
        # The table on its own may hold as much text as a file's text may be.
        if self.chars > self.budget.max_text:
            raise over(self.budget.max_text, "characters of text")


class _Sheet(_XMLStream):
    """One worksheet's rows, as openpyxl's read-only ``iter_rows(values_only=True)`` gave them
    with its dimensions reset, but without padding: a row is its cells, a line of text is
    built from them directly, and every cell, row and character is counted as it comes."""

    def __init__(self, budget: Budget, strings, date_styles, timedelta_styles, epoch):
        from openpyxl.utils.cell import coordinate_to_tuple
        from openpyxl.utils.datetime import from_excel, from_ISO8601

        super().__init__(budget)
        self.coordinate_to_tuple = coordinate_to_tuple
        self.from_excel, self.from_ISO8601 = from_excel, from_ISO8601
        self.strings = strings
        self.date_styles = date_styles
        self.timedelta_styles = timedelta_styles
        self.epoch = epoch
        self.lines: list[str] = []
        self.row_depth = 0
        self.row_attrs = None
        self.cells: list = []  # [attrs, value text, value seen, _RichText or None]
        self.in_inline = False
        self.row_counter = 0  # openpyxl's WorkSheetParser.row_counter
        self.next_row = 1  # openpyxl's _cells_by_row counter: rows before it are dropped

    def start(self, name, attrs):
        if not self.row_depth:
            if name == _XL_ROW:
                self.row_depth, self.row_attrs, self.cells = self.depth, attrs, []
            return
        level = self.depth - self.row_depth
        if level == 1:  # every child of a row is a cell to openpyxl
            self.cells.append([attrs, None, False, None])
        elif level == 2:
            cell = self.cells[-1]
            if name == _XL_VALUE and not cell[2]:
                cell[2] = True
                self.value_cell = cell
                self.gather()
            elif name == _XL_INLINE and cell[3] is None:
                cell[3] = _RichText()
                self.in_inline = True
        elif self.in_inline:
            self.rich_start(self.cells[-1][3], self.row_depth + 2, name)

    def end(self, name):
        if not self.row_depth:
            return
        level = self.depth - self.row_depth
        if level == 0:
            self.row_depth = 0
            self._row()
        elif level == 2:
            if self.value_cell is not None and self.depth == self.gather_depth:
                self.value_cell[1] = self.gathered()
                self.value_cell = None
            self.in_inline = False
        elif self.in_inline:
            self.rich_end(self.cells[-1][3], self.row_depth + 2)

    value_cell = None

    def _row(self) -> None:
        coordinate_to_tuple = self.coordinate_to_tuple
        budget = self.budget
        budget.add_row()
        budget.add_cells(len(self.cells))
        number = self.row_attrs.get("r")
        if number is not None:
            try:
                self.row_counter = int(number)
            except ValueError:
                value = float(number)
                if not value.is_integer():
                    raise ValueError("not a row number") from None
                self.row_counter = int(value)
        else:
            self.row_counter += 1
        column = 0
        values: dict[int, object] = {}
        for attrs, text, _seen, rich in self.cells:
            coordinate = attrs.get("r")
            if coordinate:
                column = coordinate_to_tuple(coordinate)[1]
            else:
                column += 1
            values[column] = self._value(attrs, text, rich)
        self.cells = []
        if self.row_counter > self.next_row:
            self.next_row = self.row_counter  # missing rows are empty: no text
        if self.row_counter < self.next_row:
            return  # a row out of order: openpyxl's reader skipped it
        self.next_row += 1
        if not values:
            return
        last = column  # the row's last cell bounds it, as openpyxl's _get_row did
        line, previous = [], 1
        for col in sorted(values):
            value = values[col]
            if value is None or not 1 <= col <= last:
                continue
            text = collapse(cell_text(value))
            if text:
                line.append(" | " * (col - previous))
                line.append(text)
                previous = col
        if line:
            text = "".join(line)
            budget.add_text(len(text) + 1)
            self.lines.append(text)

    def _value(self, attrs, text, rich):
        """A cell's value as openpyxl's WorkSheetParser.parse_cell made it (data_only)."""
        data_type = attrs.get("t", "n")
        if data_type == "inlineStr":
            return rich.content() if rich is not None else None
        value = text or None
        if value is None:
            return None
        if data_type == "n":
            value = float(value) if ("." in value or "E" in value or "e" in value) else int(value)
            style = attrs.get("s", 0)
            if style:
                style = int(style)
            if style in self.date_styles:
                try:
                    return self.from_excel(value, self.epoch, timedelta=style in self.timedelta_styles)
                except (OverflowError, ValueError):
                    return "#VALUE!"
            return value
        if data_type == "s":
            return self.strings[int(value)]
        if data_type == "b":
            return bool(int(value))
        if data_type == "d":
            return self.from_ISO8601(value)
        return value  # "str", "e" and the rest: the text as written


def _xlsx_relationships(archive, part: str, budget: Budget) -> dict[str, tuple[str, str]]:
    """Id -> (target path in the package, type), resolved as openpyxl's get_dependents did."""
    folder, name = posixpath.split(part)
    tree = read_xml(archive, posixpath.join(folder, "_rels", f"{name}.rels"), budget, forbid=True)
    rels: dict[str, tuple[str, str]] = {}
    parent = posixpath.split(folder)[0]
    for rel in (tree if tree is not None else ()):
        if _local(rel.tag) != "Relationship":
            continue
        target = rel.get("Target") or ""
        if rel.get("TargetMode") != "External":
            target = target[1:] if target.startswith("/") else posixpath.normpath(
                posixpath.join(parent, target))
        rels.setdefault(rel.get("Id"), (target, rel.get("Type") or ""))
    return rels


def _xlsx_date_styles(archive, budget: Budget) -> tuple[set, set]:
    """The cell style indexes whose number format is a date, and a duration (openpyxl's rules)."""
    from openpyxl.styles.numbers import builtin_format_code, is_date_format, is_timedelta_format

    tree = read_xml(archive, "xl/styles.xml", budget, forbid=True)
    custom: dict[int, str] = {}
    formats: list[int] = []
    for child in (tree if tree is not None else ()):
        local = _local(child.tag)
        if local == "numFmts":
            custom = {int(n.get("numFmtId")): n.get("formatCode") for n in child
                      if _local(n.tag) == "numFmt"}
        elif local == "cellXfs":
            formats = [int(xf.get("numFmtId", 0)) for xf in child if _local(xf.tag) == "xf"]
    dates, durations = set(), set()
    for index, number in enumerate(formats):
        code = custom[number] if number in custom else builtin_format_code(number)
        if is_date_format(code):
            dates.add(index)
        if is_timedelta_format(code):
            durations.add(index)
    return dates, durations


def read_xlsx(data: bytes, archive, budget: Budget) -> tuple[Outline, str | None]:
    from openpyxl.utils.datetime import CALENDAR_MAC_1904, WINDOWS_EPOCH

    manifest = read_xml(archive, "[Content_Types].xml", budget, forbid=True)
    overrides = [(o.get("PartName") or "", o.get("ContentType")) for o in manifest
                 if _local(o.tag) == "Override"]
    defaults = {d.get("ContentType") for d in manifest if _local(d.tag) == "Default"}
    part = next((name[1:] for kind in _XL_WORKBOOK_TYPES for name, t in overrides if t == kind),
                None)
    if part is None:
        if not defaults & set(_XL_WORKBOOK_TYPES):
            raise Skipped("unreadable xlsx")
        part = "xl/workbook.xml"
    workbook = read_xml(archive, part, budget, forbid=True)
    if workbook is None:
        raise Skipped("unreadable xlsx")
    rels = _xlsx_relationships(archive, part, budget)
    epoch = WINDOWS_EPOCH
    sheets = []
    for child in workbook:
        local = _local(child.tag)
        if local == "workbookPr" and child.get("date1904") not in (None, "", "false", "f", "0"):
            epoch = CALENDAR_MAC_1904
        elif local == "sheets":
            sheets = [(s.get("name"), s.get(_XL_REL_ID)) for s in child if _local(s.tag) == "sheet"]
    strings_part = next((name[1:] for name, t in overrides if t == _XL_STRINGS_TYPE), None)
    strings = _SharedStrings(budget)
    if strings_part is not None:
        strings.run(archive, strings_part)
    dates, durations = _xlsx_date_styles(archive, budget)
    members = set(archive.namelist())
    out = Outline()
    for title, rel_id in sheets:
        if not rel_id:
            continue  # openpyxl dropped a sheet without a relationship, with a warning
        target, kind = rels[rel_id]
        if target not in members or "chartsheet" in kind:
            continue
        sheet = _Sheet(budget, strings.strings, dates, durations, epoch)
        sheet.run(archive, target)
        if sheet.lines:
            out.heading(1, f'Sheet "{title}"')
            out.paragraph("\n".join(sheet.lines))
    title = None
    if "docProps/core.xml" in members:
        core = read_xml(archive, "docProps/core.xml", budget, forbid=True)
        for node in core:  # by local name, the last one, as openpyxl's properties reader did
            if _local(node.tag) == "title":
                title = node.text
    return out, (title or None)


XLSX = Extractor("xlsx", _version, (".xlsx",), "markdown", extract_xlsx, isolated=True,
                 imports=("openpyxl", "openpyxl.utils.cell", "openpyxl.utils.datetime",
                          "openpyxl.styles.numbers"))
