"""The Redlock algorithm, without Celery.

- ``redlock``: ``Redlock``, which *has* its ``LockRules``, its node set and its
  wake-ups, and drives the rules' steps (its one base, ``settings.ShowsSettings``,
  only shows the settings as attributes); ``lease``: ``LeaseState`` (a lease without
  I/O) and the ``Lease`` a blocking caller holds; ``clear``: ``clear``'s SCAN over
  every node.
- ``settings``: ``Settings``, the constructor's arguments with their defaults and
  checks, frozen; ``steps``: the step protocol (``Ask``, ``Pause``, ``Settle``)
  every operation is written in, and ``drive`` for a blocking round; ``rules``:
  ``LockRules``, the settings, node addresses, held leases and clock of one lock and
  the steps of every operation, shared with ``celery_redlock.asyncio``; ``quorum``:
  quorum and validity arithmetic, reply predicates, argument checks.
- ``commands``: what each operation sends to a node; ``scripts``, ``multi_scripts``:
  the Lua; ``stored``: what is stored under a lock key (``token|holder``, tombstones,
  fence counters, the wake channel).
- ``acquire_replies`` / ``extend_replies``: what an acquire's / an extension's
  replies mean (granted, contended, unavailable; extended, lost, retry by).
- ``reentry``: which execution holds which key; ``watchdog`` and ``renewals``: the
  renewal thread and its batched rounds; ``wake``: a blocked acquire hears releases;
  ``waiters``: the node side of hand-off (the per-key waiter queue and its claims).
- ``validate``: every value check, with errors that name the setting.

May import: ``celery_redlock.wire`` and ``celery_redlock.errors``; never Celery
(``tests/ops/test_layout.py`` enforces it, transitively).
"""
