"""The fault lab: lock-level fault scenarios and the independent oracle that judges
them, shared by tests/lock/test_faults.py and ``python -m tools.soak``.

- :mod:`.evidence`: what holders record -- their logs, the recording clock, the naive
  fenced store -- and reading it back;
- :mod:`.oracle`: the checker (overlaps, stale writes, fence regressions, leases born
  dead or overclaiming);
- :mod:`.scanner`: lock keys and tombstones left without a TTL;
- :mod:`.holders`: the holder processes that run the lock (``python -m
  tools.faultlab.holders``);
- :mod:`.lab`: Lab, RowResult and the Fleet of holders every scenario uses;
- the rows of the matrix: :mod:`.crashes` (1-4), :mod:`.network` (5, 8),
  :mod:`.clocks` (6, 12).

Kept light: importing a submodule must not load celery_redlock before a holder needs it.
"""
