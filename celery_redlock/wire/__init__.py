"""Talking to lock nodes: everything between a command and the replies of N nodes.

- ``resp``: the RESP2 codec and ``Command`` (EVALSHA with cached prefixes).
- ``script``: the ``Script`` type (Lua source and SHA1) and the scripts every new
  connection loads in its handshake.
- ``round``: the sans-IO round -- fed "reply from node i", "failed", "deadline
  passed"; says when the outcome is decided. No sockets, no clock.
- ``connection``: one non-blocking connection; ``node``: one master (URL or client,
  TLS, Sentinel-managed); ``node_set``: the node set and its poll driver.
- ``sentinel``: ``sentinel://`` node URLs and master discovery.
- ``cluster``, ``cluster_node``, ``cluster_view``: a Redis Cluster as one node
  (``redis+cluster://`` URLs, names in one hash slot, routing and redirects, and the
  operators' per-master view).
- ``late_replies``: the thread that reads the replies a round stopped waiting for.
- ``unpatched``, ``background``: the interpreter's own primitives past gevent's or
  eventlet's monkey-patching, and the background threads made from them.

May import: ``celery_redlock.errors`` only. Knows nothing of locks or Celery
(``tests/ops/test_layout.py`` enforces it).
"""

#: Whether this wire layer is the optional compiled build (setup.py,
#: ``CELERY_REDLOCK_COMPILE=1``): its modules are then extension modules.
COMPILED: bool = not __file__.endswith(".py")
