"""What a file-system crash run checked (pmemwal.tools.fs_crash, fs_salvage): its report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class FsCrashReport:
    """What a run checked, and what (must not have) failed."""

    fs_model: str
    workload: str
    seed: int = 0
    crash_points: int = 0
    background_points: int = 0    # ... of which in the WAL's background writer's operations
    states_checked: int = 0       # recoveries run (a distinct state is checked again when
    distinct_states: int = 0      # ... what had been acknowledged differs)
    metadata_states: int = 0      # distinct states that lost some pending metadata operation
    per_file_states: int = 0      # distinct states whose files took data outcomes of their own
    lost: int = 0
    stale: int = 0
    untyped: int = 0              # recovery raised something that is not a WALError
    refused: int = 0              # a WALError where nothing was lost (a failure)
    expected_refusals: int = 0    # a restore cut short: open refuses, as designed
    kills: int = 0                # shared: writers killed mid-truncation, then reopened
    operations: int = 0           # metadata operations recorded
    records_written: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.stale or self.untyped or self.refused)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}
