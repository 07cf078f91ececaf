"""How the harness writes things down: record sizes as the CLI takes them (``8k``),
series labels (``direct insert_slots=64``) and picking a series by its name, counter
column titles, rates, and ``Table``, a grid of numbers as plain text or markdown.

May touch: nothing; pure functions of their arguments, shared by the other modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from pmemwal.errors import ConfigError


def size_text(n: int) -> str:
    """``8192`` -> ``8k``, ``1048576`` -> ``1m``, ``100`` -> ``100`` (as the CLI takes them)."""
    for unit, scale in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _rate_text(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _value_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def series_label(target: str, params: dict) -> str:
    """``direct insert_slots=64 segment_size=64m``: sizes as they are written."""
    return " ".join([target] + [f"{k}={_param_text(k, v)}" for k, v in sorted(params.items())])


# params that are sizes in bytes: labels print them as the CLI takes them (64m)
_SIZE_PARAMS = ("segment_size", "keep_bytes", "buffer_size", "max_wal_size", "preallocate",
                "max_record_size", "gil_release_size")


def _param_text(name: str, value: object) -> str:
    if name in _SIZE_PARAMS and isinstance(value, int) and not isinstance(value, bool) and value:
        return size_text(value)
    return _value_text(value)


def pick_baseline(baseline: str, series: list[str], where: str) -> str:
    """The series ``baseline`` names: a whole label (``direct insert_slots=8``), or a
    target alone for its first series; a label that matches none is an error naming the
    valid ones, never a quiet fall-back to another series."""
    wanted = " ".join(baseline.split())
    if wanted in series:
        return wanted
    if len(wanted.split()) == 1:  # a target alone: its first series (of the first group joined)
        for name in (lambda label: label.split()[0], lambda label: label.split()[0].lower()):
            for label in series:     # (never another build's or group's: "direct@..." differs)
                if name(label) in (wanted, wanted.lower()):
                    return label
    raise ConfigError(f"baseline {baseline!r}: no such series in {where} (valid: "
                      f"{', '.join(series)})")


def column_title(name: str) -> str:
    """``slot_wait_ns`` -> ``slot_wait ms/s``, ``flushes`` -> ``flushes /s``."""
    return f"{name.removesuffix('_ns')} ms/s" if name.endswith("_ns") else f"{name} /s"


@dataclass
class Table:
    """A grid of numbers: rows (client counts) by columns (record sizes)."""

    title: str
    row_name: str
    columns: list[str]
    rows: Sequence[tuple[object, Sequence[float | None]]]   # (read only)
    number_format: Callable[[float], str]

    def cells(self) -> list[list[str]]:
        header = [self.row_name] + self.columns
        body = [[str(key)] + ["-" if v is None else self.number_format(v) for v in values]
                for key, values in self.rows]
        return [header] + body

    def text(self) -> str:
        """Plain text, right-aligned columns, the title above."""
        cells = self.cells()
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        lines = [self.title]
        for n, row in enumerate(cells):
            lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def markdown(self) -> str:
        """A GitHub-flavoured markdown table, the title in bold above."""
        cells = self.cells()
        lines = [f"**{self.title}**", "", "| " + " | ".join(cells[0]) + " |",
                 "|" + "|".join("---:" for _ in cells[0]) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines)
