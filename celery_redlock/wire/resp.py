"""The RESP2 codec: commands to bytes, bytes to replies.

``pack`` encodes one command; ``Command`` is one script call packed once (EVALSHA,
with the ``*N EVALSHA <sha> <numkeys>`` prefix cached per script and shape, since a
lock operation packs one per round) and its EVAL fallback for a node that answered
NOSCRIPT. ``parse`` reads one reply from a buffer and says when it needs more bytes;
an error reply comes back as an *instance* of redis-py's error class for it (errors
are data here, not control flow).

Pure functions over bytes: no sockets, no clock. Imports redis-py's exception
classes and scripts.py's ``Script`` only; nothing else from the package.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Final, Sequence, Union

from redis import exceptions as rexc

from .script import Script

__all__ = ["INCOMPLETE", "Command", "Plain", "pack", "parse"]


def pack(*args: Union[bytes, str, int]) -> bytes:
    """RESP-encode one command."""
    return b"*%d\r\n%s" % (len(args), _bulk(args))


def _bulk(args: Sequence[Union[bytes, str, int]]) -> bytes:
    """``args`` as RESP bulk strings, one after the other (hot path: no array header)."""
    parts = []
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        else:
            data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


_EVALSHA_PREFIXES: dict[tuple[str, int, int], bytes] = {}


def _evalsha_prefix(script: Script, numkeys: int, argc: int) -> bytes:
    """``*N EVALSHA <sha> <numkeys>`` packed once per script and shape (hot path)."""
    shape = (script.sha, numkeys, argc)
    prefix = _EVALSHA_PREFIXES.get(shape)
    if prefix is None:
        prefix = pack(b"EVALSHA", script.sha, numkeys)
        prefix = b"*%d" % (3 + numkeys + argc) + prefix[prefix.index(b"\r\n") :]
        _EVALSHA_PREFIXES[shape] = prefix
    return prefix


class Command:
    """One script call, packed once and sent to every node of a round."""

    __slots__ = ("_args", "_keys", "payload", "script")

    def __init__(
        self, script: Script, keys: Sequence[str], args: Sequence[Union[bytes, str, int]]
    ) -> None:
        self.script = script
        self._keys = tuple(keys)
        self._args = tuple(args)
        self.payload = _evalsha_prefix(script, len(self._keys), len(self._args)) + _bulk(
            self._keys + self._args
        )

    @property
    def keys(self) -> tuple[str, ...]:
        """The key names the call declares (``KEYS``)."""
        return self._keys

    def renamed(self, keys: Sequence[str], rename: Callable[[str], str]) -> Command:
        """The same call with ``keys`` as its key names and ``rename`` applied to
        every argument the script says names a key (``Script.names``): how a
        Redis Cluster node is sent it (wire/cluster.py)."""
        args = list(self._args)
        for position in self.script.names:
            arg = args[position - 1]
            args[position - 1] = rename(arg.decode() if isinstance(arg, bytes) else str(arg))
        return Command(self.script, keys, args)

    def eval_args(self) -> tuple[Any, ...]:
        """The call as ``EVAL`` arguments (``redis.Redis.eval(*command.eval_args())``),
        for a plain client that may not have loaded the script (the CLI)."""
        return (self.script.source, len(self._keys), *self._keys, *self._args)

    def fallback(self) -> bytes:
        """The same call as EVAL, for a node that answered NOSCRIPT."""
        return pack(b"EVAL", self.script.source, len(self._keys), *self._keys, *self._args)


class Plain(Command):
    """A plain command, not a script call (``CLUSTER SLOTS``, ``ASKING``), sent on a
    lock connection like one: it has no keys and nothing to fall back to."""

    __slots__ = ()

    def __init__(self, *args: Union[bytes, str, int]) -> None:
        self._keys = ()
        self._args = tuple(args)
        self.payload = pack(*args)

    def renamed(self, keys: Sequence[str], rename: Callable[[str], str]) -> Command:
        return self

    def eval_args(self) -> tuple[Any, ...]:
        return self._args

    def fallback(self) -> bytes:
        return self.payload

    def __repr__(self) -> str:
        return f"<Plain {self._args!r}>"


class _Incomplete:
    def __repr__(self) -> str:
        return "INCOMPLETE"


#: What ``parse`` returns when the buffer does not hold a whole reply yet.
INCOMPLETE: Final = _Incomplete()

_ERROR_CLASSES: Final[dict[str, type[rexc.RedisError]]] = {
    "NOSCRIPT": rexc.NoScriptError,
    "NOAUTH": rexc.AuthenticationError,
    "WRONGPASS": rexc.AuthenticationError,
    "NOPERM": rexc.NoPermissionError,
    "READONLY": rexc.ReadOnlyError,
    "LOADING": rexc.BusyLoadingError,
    "OOM": rexc.OutOfMemoryError,
}


# Redis 6 wraps an error raised inside a script: "ERR Error running script (call to
# f_...): @user_script:9: @user_script: 9: -READONLY You can't write against a read
# only replica." (Redis 7 passes "READONLY ..." through): classified by the inner code.
_INNER_ERROR: Final = re.compile(r"\s-([A-Z]+)\s")


def _error(line: bytes) -> rexc.RedisError:
    text = line.decode("utf-8", "replace")
    code = text.split(" ", 1)[0]
    if code == "ERR" and "@user_script" in text:
        inner = _INNER_ERROR.search(text)
        code = inner.group(1) if inner else code
    cls = _ERROR_CLASSES.get(code, rexc.ResponseError)
    return cls(text)


def parse(buf: Union[bytes, bytearray], pos: int) -> tuple[object, int]:
    """Parse one RESP2 reply at ``pos``; ``(INCOMPLETE, pos)`` when more bytes are needed.

    Returns the reply and the position just past it. Errors come back as exception
    *instances*; an unknown reply type raises ``redis.InvalidResponse``.
    """
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return INCOMPLETE, pos
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    nxt = end + 2
    if kind == 0x3A:  # ':' integer
        return int(line), nxt
    if kind == 0x24:  # '$' bulk string
        size = int(line)
        if size < 0:
            return None, nxt
        if len(buf) < nxt + size + 2:
            return INCOMPLETE, pos
        return bytes(buf[nxt : nxt + size]), nxt + size + 2
    if kind == 0x2A:  # '*' array
        count = int(line)
        if count < 0:
            return None, nxt
        items: list[object] = []
        for _ in range(count):
            item, nxt = parse(buf, nxt)
            if item is INCOMPLETE:
                return INCOMPLETE, pos
            items.append(item)
        return items, nxt
    if kind == 0x2B:  # '+' simple string
        return line, nxt
    if kind == 0x2D:  # '-' error
        return _error(line), nxt
    raise rexc.InvalidResponse(f"unexpected reply type {chr(kind)!r}")
