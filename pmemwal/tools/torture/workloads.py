"""The torture workloads by name: the registry the child entry point and the round driver
pick a plugin from (``plugin.TortureWorkload``)."""

from __future__ import annotations

from pmemwal.tools.torture import checkpointer, log, shared, wal
from pmemwal.tools.torture.plugin import TortureWorkload

PLUGINS: dict[str, TortureWorkload] = {
    w.name: w for w in (wal.WORKLOAD, checkpointer.WORKLOAD, log.WORKLOAD, shared.WORKLOAD)}
# what a round run is asked for by name (``pmemwal torture --workload``): records of a WAL,
# entries of a pmemwal.Log; --checkpoint makes the first the checkpointer workload,
# --processes runs the shared one
WORKLOADS = ("wal", "log")


def round_workload(name: str, checkpoint: float = 0.0) -> TortureWorkload:
    """The plugin of a round run's ``name``; with ``checkpoint`` (wal only), the checkpointer."""
    if checkpoint:
        return checkpointer.CheckpointerWorkload(checkpoint)
    return PLUGINS[name]
