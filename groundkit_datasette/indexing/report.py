"""What an ingest run did: the report it returns, and the summary the manifest keeps."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

# Files listed by name in a collection's ingest_report entry; the counts cover every file.
MAX_REPORTED_FILES = 200


@dataclass
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_files: list[tuple[str, str]] = field(default_factory=list)
    failed_files: list[tuple[str, str]] = field(default_factory=list)
    chunks_written: int = 0
    chunks_embedded: int = 0
    seconds: float = 0.0
    generation: int = 0
    published: bool = False
    # Chunks whose vector was missing (a lost or incomplete <name>.lance) and was embedded again.
    vectors_restored: int = 0
    # Where files were extracted and chunked: "local" (this process) or "given" (a map stage
    # passed in, such as a cluster's).
    map_stage: str = "local"

    @property
    def chunks_per_second(self) -> float:
        return self.chunks_written / self.seconds if self.seconds > 0 else 0.0

    def skip(self, source: str, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.skipped_files.append((source, reason))

    def fail(self, source: str, reason: str) -> None:
        self.failed += 1
        self.failed_files.append((source, reason))

    def as_dict(self) -> dict:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "failed": self.failed,
            "skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(self.skipped),
            "chunks_written": self.chunks_written,
            "chunks_embedded": self.chunks_embedded,
            "seconds": round(self.seconds, 3),
            "chunks_per_second": round(self.chunks_per_second, 1),
            "generation": self.generation,
            "published": self.published,
            "vectors_restored": self.vectors_restored,
            "map_stage": self.map_stage,
            "failed_files": [{"source": s, "reason": r} for s, r in self.failed_files],
            "skipped_files": [{"source": s, "reason": r} for s, r in self.skipped_files],
        }

    @property
    def written(self) -> int:
        """Documents this run added or rewrote (an access-list-only change counts)."""
        return self.added + self.updated


def ingest_summary(report: IngestReport) -> str:
    """The manifest's ``ingest_report``: what the publishing run skipped or could not ingest."""
    return json.dumps({
        "skipped": len(report.skipped_files),
        "failed": len(report.failed_files),
        "skipped_files": [[s, r] for s, r in report.skipped_files[:MAX_REPORTED_FILES]],
        "failed_files": [[s, r] for s, r in report.failed_files[:MAX_REPORTED_FILES]],
    })
