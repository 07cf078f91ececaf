"""Crash torture: kill writing child processes with SIGKILL at random moments, reopen, check.

One framework, workloads as plugins (``plugin.TortureWorkload``):

- ``driver``: the rounds (``run``, ``play_round``): a child, a kill, a recovery and a
  check per round, against the directory's ledger; ``crash``: one child run and kill,
  its pipe read; ``report``: the totals; ``setups``: persist setups, segment sizes, slots;
- ``child``: the one child entry point, ``python -m pmemwal.tools.torture.child SPEC``,
  running the workload the spec names (``workloads``); ``childkit``: what every child
  does besides (whole pipe lines, threads whose failure ends the process);
- the workloads: ``wal`` (records appended, flushed, truncated), ``checkpointer`` (those
  and a checkpointer thread), ``log`` (a ``pmemwal.Log``: ``log_entries``, ``log_model``),
  ``shared`` (writer processes sharing one WAL, killed and replaced: its own loop);
  ``records``: the self-describing records they write.

``pmemwal torture`` is the command line.  This package module imports nothing: each
user imports the module it needs.
"""
