"""The Lua scripts of multi-resource locks (``redlock.acquire(["a", "b"])``).

Split from scripts.py by feature: the same rules hold (each script atomic on its
node, a key changed only after checking it holds our value). scripts.py re-exports
them and lists them in ``ALL_SCRIPTS``.

Imports wire/script.py only.
"""

from __future__ import annotations

from typing import Final

from ..wire.script import Script
from .stored import RELEASED, publish_wake

__all__ = [
    "ACQUIRE_MULTI",
    "EXTEND_MULTI",
    "FENCE_MULTI",
    "MULTI_SCRIPTS",
    "OWNED_MULTI",
    "RELEASE_MULTI",
]

# -- multi-resource locks (redlock.acquire(["a", "b"])): every key or none, per node --
#
# A multi lease stores one value (token|holder) under each of its keys, in canonical
# (sorted) order, and each script below checks or changes the whole set in one atomic
# call per node: a node grants, extends or releases all of the keys, or none of them.
# The set's keys come first (KEYS[1..n]), then per-key companions in the same order;
# ARGV carries n, since KEYS holds more than the lock keys.

ACQUIRE_MULTI: Final = Script(
    """
-- KEYS[1..n] lock keys; KEYS[n+1..2n] their tombstones for our token; when fenced,
-- KEYS[2n+1..3n] their fence counters
-- ARGV[1] our value; ARGV[2] ttl in milliseconds; ARGV[3] n; ARGV[4] '1' when fenced
-- returns 1 (fenced: {1, the highest counter of the n keys}) when every key was free
--         (or held our value: the same call resent) and all now hold it for ttl;
--         {holder value, pttl in ms} when someone holds any key: the first such key's
--         holder, and the longest pttl among the held keys (when this node frees);
--         {false, -2} when our own release already passed by (a late call: no key set)
local n = tonumber(ARGV[3])
for i = n + 1, 2 * n do
  if redis.call('exists', KEYS[i]) == 1 then
    return {false, -2}
  end
end
local holder = false
local longest = -2
for i = 1, n do
  local held = redis.call('get', KEYS[i])
  if held and held ~= ARGV[1] then
    holder = holder or held
    longest = math.max(longest, redis.call('pttl', KEYS[i]))
  end
end
if holder then
  return {holder, longest}
end
for i = 1, n do
  redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
if ARGV[4] ~= '1' then
  return 1
end
local seen = 0
for i = 2 * n + 1, 3 * n do
  seen = math.max(seen, tonumber(redis.call('get', KEYS[i]) or '0'))
end
return {1, seen}
"""
)

FENCE_MULTI: Final = Script(
    """
-- KEYS[1..n] lock keys; KEYS[n+1..2n] their fence counters
-- ARGV[1] our value; ARGV[2] fence T; ARGV[3] n; ARGV[4] the counters' ttl in ms
-- Second round of a fenced multi acquire (see FENCE): T is recorded on every key's
-- counter, so a later holder of any one of the keys reads >= T and fences higher.
-- returns 1 when every counter is now >= T; 0 when a key is not ours (nothing changed)
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('get', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = n + 1, 2 * n do
  if tonumber(redis.call('get', KEYS[i]) or '0') < tonumber(ARGV[2]) then
    redis.call('set', KEYS[i], ARGV[2], 'PX', ARGV[4])
  else
    redis.call('pexpire', KEYS[i], ARGV[4])
  end
end
return 1
"""
)

EXTEND_MULTI: Final = Script(
    """
-- KEYS[1..n] lock keys; ARGV[1] our value; ARGV[2] new ttl in ms; ARGV[3] n
-- returns 1 when every key held our value and now expires ttl from now; 0 when any
-- key is not ours (nothing changed: the node no longer holds the whole set)
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('get', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = 1, n do
  redis.call('pexpire', KEYS[i], ARGV[2])
end
return 1
"""
)

RELEASE_MULTI: Final = Script(
    """
-- KEYS[1..n] lock keys; KEYS[n+1..2n] their tombstones for our token
-- ARGV[1] our value; ARGV[2] tombstone ttl in ms; ARGV[3] n
-- Deletes each key that holds our value (each deletion published, as RELEASE);
-- leaves the others untouched, with a tombstone for our token where the key is
-- absent (a late ACQUIRE_MULTI of ours then sets nothing, as RELEASE).
-- returns 1 when every key held our value (the whole set is now deleted); 0 otherwise
local n = tonumber(ARGV[3])
local deleted = 0
for i = 1, n do
  if redis.call('get', KEYS[i]) == ARGV[1] then
    deleted = deleted + redis.call('del', KEYS[i])
    WAKE(KEYS[i])
  elseif redis.call('exists', KEYS[i]) == 0 then
    redis.call('set', KEYS[n + i], '1', 'PX', ARGV[2])
  end
end
if deleted == n then
  return 1
end
return 0
""".replace("WAKE(KEYS[i])", publish_wake("KEYS[i]", RELEASED))
)

OWNED_MULTI: Final = Script(
    """
-- KEYS[1..n] lock keys; ARGV[1] our value; read-only
-- returns 1 when every key holds our value; 0 otherwise
for i = 1, #KEYS do
  if redis.call('get', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
return 1
"""
)

MULTI_SCRIPTS: Final = (ACQUIRE_MULTI, FENCE_MULTI, EXTEND_MULTI, RELEASE_MULTI, OWNED_MULTI)
