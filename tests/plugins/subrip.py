"""A third-party groundkit plugin used by the tests: reads SubRip subtitles (.srt).

The text is the cues' lines, one paragraph per cue, without the cue numbers and timings; the
title is the first cue. It is isolated, as a plugin parsing untrusted bytes should be: the
dispatcher calls ``extract_srt`` in an isolation worker, by module and name."""

import re

from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.indexing.formats.base import Extraction, Extractor, Skipped
from groundkit_datasette.indexing.formats.text import decoded

_TIMING = re.compile(r"\d\d:\d\d:\d\d[,.]\d{3} --> \d\d:\d\d:\d\d[,.]\d{3}")


def extract_srt(data: bytes, *, encoding, budget) -> Extraction:
    plain = decoded(data, encoding)
    cues = []
    for block in re.split(r"\r?\n\r?\n", plain.text.strip()):
        lines = block.splitlines()
        if len(lines) < 2 or not lines[0].strip().isdigit() or not _TIMING.fullmatch(lines[1].strip()):
            raise Skipped("not a subrip file")
        cues.append("\n".join(lines[2:]))
    text = "\n\n".join(cues)
    budget.add_text(len(text))
    return Extraction(text, cues[0] if cues else None, encoding=plain.encoding)


SUBRIP = Extractor("subrip", "1", (".srt",), "text", extract_srt, isolated=True)


@hookimpl
def register_extractors(register):
    register(SUBRIP)
