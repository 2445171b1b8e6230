"""The Lua scripts the lock runs on every node, and their wire form.

Each script is atomic on its node and changes a key only after checking that the key
still holds our value, so a client whose lease ran out (and whose key was taken by
someone else) can never touch the new holder's lock. Each one is a single command on
the wire (EVALSHA), which is what keeps a lock operation at one command per node.

The multi-key scripts live in multi_scripts.py, those of limits and rates in
permit_scripts.py, and the ``Script`` class in wire/script.py (re-exported here);
this module imports only those and stored.py.
"""

from __future__ import annotations

from typing import Final

from ..wire.script import Script, preload
from .multi_scripts import (
    ACQUIRE_MULTI,
    EXTEND_MULTI,
    FENCE_MULTI,
    MULTI_SCRIPTS,
    OWNED_MULTI,
    RELEASE_MULTI,
)
from .permit_scripts import PERMIT_SCRIPTS
from .stored import FIRST_HOLD, RELEASED, WAKE_SUFFIX, lua_text, publish_wake

__all__ = [
    "ACQUIRE",
    "ACQUIRE_FENCED",
    "ACQUIRE_MULTI",
    "ALL_SCRIPTS",
    "CLAIM_WAITER",
    "EXTEND",
    "EXTEND_HOLD",
    "EXTEND_MANY",
    "EXTEND_MULTI",
    "EXTEND_VALUE",
    "FENCE",
    "FENCED_SET",
    "FENCE_MULTI",
    "FORCE_RELEASE",
    "HOLDER",
    "MULTI_SCRIPTS",
    "OWNED_MULTI",
    "POP_WAITER",
    "REENTER",
    "REGISTER_WAITER",
    "RELEASE",
    "RELEASE_HOLD",
    "RELEASE_MULTI",
    "SWAP_PLACE",
    "WAKE_SUFFIX",
    "Script",
]


ACQUIRE: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its tombstone for our token (see RELEASE)
-- ARGV[1] our value (token|holder); ARGV[2] ttl in milliseconds
-- returns 1 when the key was free and is now ours for ttl (or already held our value:
--         the same SET resent after a broken connection);
--         {holder value, its pttl in ms} when someone holds it (so a refusal can say
--         who holds the lock and when it frees, at no extra round trip);
--         {false, -2} when our own release already passed by (a late SET: never set)
if redis.call('exists', KEYS[2]) == 1 then
  return {false, -2}
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
local held = redis.call('get', KEYS[1])
if held == ARGV[1] then
  return 1  -- our own SET, sent again on a fresh connection: still ours
end
return {held, redis.call('pttl', KEYS[1])}
"""
)

ACQUIRE_FENCED: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its tombstone for our token; KEYS[3] the key's fence
-- counter (expires holders.FENCE_COUNTER_TTL after its last fence)
-- ARGV[1] our value; ARGV[2] ttl in milliseconds
-- returns {1, counter} when the key was free and is now ours (counter: the highest
--         fence this node has seen granted for the key, 0 if none);
--         {holder value, its pttl in ms} when someone holds it;
--         {false, -2} when our own release already passed by
if redis.call('exists', KEYS[2]) == 1 then
  return {false, -2}
end
local held = false
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  held = redis.call('get', KEYS[1])
  if held ~= ARGV[1] then
    return {held, redis.call('pttl', KEYS[1])}
  end  -- our own SET, sent again on a fresh connection: still ours
end
return {1, tonumber(redis.call('get', KEYS[3]) or '0')}
"""
)

FENCE: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its fence counter; ARGV[1] our value; ARGV[2] fence T;
-- ARGV[3] the counter's ttl in milliseconds, from now
-- Second round of a fenced acquire: record T as seen, but only on a node where we
-- still hold the lock, so a later holder's quorum (which must meet ours) reads >= T.
-- returns 1 when the counter is now >= T; 0 when the key is not ours (nothing changed)
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local seen = tonumber(redis.call('get', KEYS[2]) or '0')
if seen < tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('pexpire', KEYS[2], ARGV[3])
end
return 1
"""
)

EXTEND: Final = Script(
    """
-- KEYS[1] lock key; ARGV[1] our value; ARGV[2] new ttl in milliseconds
-- returns 1 when the key held our value and now expires ttl from now; 0 otherwise
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
)

RELEASE: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its tombstone for our token; ARGV[1] our value;
-- ARGV[2] tombstone ttl in milliseconds
-- returns 1 when the key held our value and is now deleted; 0 when it was not ours
-- (expired, or taken by another holder: left untouched). A deletion is published on
-- the key's wake channel (blocked acquirers wake at once; errors ignored).
-- When the key is absent, our SET may still be on its way (an acquire stops reading
-- once a quorum answered, and this release may travel on another connection and
-- overtake it): leave a tombstone for our token so that late SET is never applied.
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  WAKE(KEYS[1])
  return 1
end
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('set', KEYS[2], '1', 'PX', ARGV[2])
end
return 0
""".replace("WAKE(KEYS[1])", publish_wake("KEYS[1]", RELEASED))
)

HOLDER: Final = Script(
    """
-- KEYS[1] lock key
-- returns {value or false, pttl in ms (-2: no key, -1: no expiry)}; read-only
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1])}
"""
)

FORCE_RELEASE: Final = Script(
    """
-- KEYS[1] lock key; no token check (an operator's release of a stuck lock).
-- Only the lock key: its fence counter stays (fences never go backwards) and its
-- tombstones expire by themselves.
-- returns 1 when the key existed and is now deleted (published, as RELEASE); 0 when
-- it was absent
local deleted = redis.call('del', KEYS[1])
if deleted == 1 then
  WAKE(KEYS[1])
end
return deleted
""".replace("WAKE(KEYS[1])", publish_wake("KEYS[1]"))
)

FENCED_SET: Final = Script(
    """
-- Storage side of fencing: a write guarded by the writer's fence.
-- KEYS[1] data key; KEYS[2] the highest fence that wrote it (never expires)
-- ARGV[1] value; ARGV[2] the writer's fence
-- returns 1 when written (fence >= every fence that wrote before: the same holder may
--         write again); 0 when refused (a later holder has written: this writer's
--         lease was superseded, e.g. it paused past its validity)
local seen = tonumber(redis.call('get', KEYS[2]) or '-1')
if tonumber(ARGV[2]) < seen then
  return 0
end
redis.call('set', KEYS[1], ARGV[1])
redis.call('set', KEYS[2], ARGV[2])
return 1
"""
)

# -- reentrancy (redlock reentrant=True): the holds of one value, counted on the node --

#: stored.FIRST_HOLD as a Lua string: the scripts and the Python side name it once.
_FIRST_HOLD: Final = f"'{lua_text(FIRST_HOLD)}'"
#
# A lease re-acquired by the execution that holds it is one more *hold* of the same
# value: the lock key keeps ``token|holder``, and a set beside it (``<key>\0holds\0
# <token>``, see stored.reentry_holds) names each hold by a nonce, the first hold
# being stored.FIRST_HOLD. Adding a nonce is idempotent, so a command resent on a
# fresh connection counts once. Both keys expire together; the last hold to go
# deletes both. A released hold leaves a tombstone of its own (see RELEASE_HOLD).

REENTER: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its holds set for our value; KEYS[3] this hold's
-- tombstone (see RELEASE_HOLD)
-- ARGV[1] our value; ARGV[2] ttl in milliseconds; ARGV[3] this hold's nonce
-- returns {1, holds} when the key holds our value (holds: how many now, this one
--         included); expiry becomes the later of the current one and ttl from now,
--         so a hold never shortens another's;
--         {holder value, its pttl in ms} when someone else holds it; {false, -2} absent,
--         or when this hold's release already passed by (a late REENTER: no hold added)
if redis.call('exists', KEYS[3]) == 1 then
  return {false, -2}
end
local held = redis.call('get', KEYS[1])
if held ~= ARGV[1] then
  return {held, redis.call('pttl', KEYS[1])}
end
if redis.call('exists', KEYS[2]) == 0 then
  redis.call('sadd', KEYS[2], FIRST_HOLD)  -- the first hold, taken by a plain acquire
end
redis.call('sadd', KEYS[2], ARGV[3])
local ttl = math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[2]))
redis.call('pexpire', KEYS[1], ttl)
redis.call('pexpire', KEYS[2], ttl)
return {1, redis.call('scard', KEYS[2])}
""".replace("FIRST_HOLD", _FIRST_HOLD)
)

EXTEND_HOLD: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its holds set; ARGV[1] our value; ARGV[2] ttl in ms
-- returns 1 when the key held our value and now expires no sooner than ttl from now
-- (never sooner than before: another hold may count on it); 0 otherwise
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ttl = math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[2]))
redis.call('pexpire', KEYS[1], ttl)
if redis.call('exists', KEYS[2]) == 1 then
  redis.call('pexpire', KEYS[2], ttl)
end
return 1
"""
)

EXTEND_VALUE: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its holds set; ARGV[1] our value; ARGV[2] ttl in ms
-- An extension by whoever was handed the value (Redlock.extend_value), which cannot
-- know whether it was re-acquired: where this node counts holds of it, as
-- EXTEND_HOLD (never sooner than before, the holds set with the key); else as EXTEND.
-- returns 1 when the key held our value and was extended; 0 otherwise
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('exists', KEYS[2]) == 0 then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
local ttl = math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[2]))
redis.call('pexpire', KEYS[1], ttl)
redis.call('pexpire', KEYS[2], ttl)
return 1
"""
)

RELEASE_HOLD: Final = Script(
    """
-- KEYS[1] lock key; KEYS[2] its holds set; KEYS[3] its tombstone for our token;
-- KEYS[4] this hold's tombstone
-- ARGV[1] our value; ARGV[2] this hold's nonce; ARGV[3] tombstone ttl in ms
-- returns 1 when the key held our value: this hold is gone, and the key too when it
--         was the last: this hold was in the set and none is left, or there is no set
--         and this is the first hold (a plain lease never re-acquired on this
--         node). A hold this node never counted (its REENTER did not land here:
--         the undo of a failed re-acquire) leaves the key alone.
--         0 when it was not ours (left untouched; a tombstone when absent, as RELEASE)
-- A re-acquired hold leaves its own tombstone: its REENTER may still be on its way
-- (the round stopped at a quorum; this release may overtake it on another
-- connection), and must not add, after its release, a hold nobody would release.
if ARGV[2] ~= FIRST_HOLD then
  redis.call('set', KEYS[4], '1', 'PX', ARGV[3])
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  local removed = redis.call('srem', KEYS[2], ARGV[2])
  if redis.call('scard', KEYS[2]) == 0 and (removed == 1 or ARGV[2] == FIRST_HOLD) then
    redis.call('del', KEYS[1], KEYS[2])
    WAKE(KEYS[1])
  end
  return 1
end
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('set', KEYS[3], '1', 'PX', ARGV[3])
end
return 0
""".replace("WAKE(KEYS[1])", publish_wake("KEYS[1]", RELEASED)).replace("FIRST_HOLD", _FIRST_HOLD)
)

EXTEND_MANY: Final = Script(
    """
-- Many leases' EXTEND in one call (the watchdog's batched renewal).
-- KEYS[i] a lock key; ARGV[2i-1] our value for KEYS[i]; ARGV[2i] its new ttl in ms
-- returns {r1, ..., rn}: ri is 1 when KEYS[i] held our value and now expires its ttl
-- from now; 0 otherwise (that key alone is left untouched). Independent masters, so
-- the keys may lie in any hash slot.
local out = {}
for i = 1, #KEYS do
  if redis.call('get', KEYS[i]) == ARGV[2 * i - 1] then
    out[i] = redis.call('pexpire', KEYS[i], ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
"""
)

# -- hand-off to waiting duplicates (lock/waiters.py; SAFETY.md "Hand-off to waiting
# duplicates"): a per-key waiter queue, and the claim that lets one of a waiter's two
# copies (its wake and its fallback) go on. The queue is a hint; only CLAIM_WAITER
# bears on safety, and its value never changes once set.

REGISTER_WAITER: Final = Script(
    """
-- KEYS[1] the key's waiter queue (sorted set); KEYS[2] this waiter's message key;
-- KEYS[3] this waiter's claim key; KEYS[4] what is there while the lock is taken (the
-- lock key itself, a limit's note that every permit is taken), if given
-- ARGV[1] waiter id; ARGV[2] score (the task's first arrival, ms); ARGV[3] the message
-- to publish when woken; ARGV[4] entry ttl in ms
-- returns 1: queued; 2: queued, and KEYS[4] is not here (the lock, a permit, freed
-- since the waiter was refused: a release may have come before this registration,
-- woken nobody, and the caller wakes the queue itself); 0: the waiter is claimed here
-- (a copy of it ran or runs: a wake of it could only lose the claim), not queued.
-- The message key expires by itself (a dead waiter's entry goes with it); the queue
-- lives at least as long as its newest entry.
if redis.call('exists', KEYS[3]) == 1 then
  return 0
end
redis.call('zadd', KEYS[1], ARGV[2], ARGV[1])
redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[4])
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('pexpire', KEYS[1], ARGV[4])
end
if KEYS[4] and redis.call('exists', KEYS[4]) == 0 then
  return 2
end
return 1
"""
)

POP_WAITER: Final = Script(
    """
-- KEYS[1] the key's waiter queue; ARGV[1] the prefix of a waiter's message key (the
-- waiter id is appended)
-- returns {waiter id, score, message} of the earliest entry whose message key is still
-- alive, removed from the queue with its message key (entries met expired are dropped);
-- false when no live entry is left
while true do
  local head = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
  if #head == 0 then
    return false
  end
  redis.call('zrem', KEYS[1], head[1])
  local message = redis.call('get', ARGV[1] .. head[1])
  if message then
    redis.call('del', ARGV[1] .. head[1])
    return {head[1], head[2], message}
  end
end
""",
    names=(1,),
)

CLAIM_WAITER: Final = Script(
    """
-- KEYS[1] the waiter id's claim key; KEYS[2] the key's waiter queue; KEYS[3] this
-- waiter's message key; ARGV[1] our copy id; ARGV[2] claim ttl in ms; ARGV[3] waiter id
-- returns the copy id the claim holds now (ours when it was free: SET NX; never
-- changed once set). The waiter's queue entry goes: the waiter is being run.
redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
redis.call('zrem', KEYS[2], ARGV[3])
redis.call('del', KEYS[3])
return redis.call('get', KEYS[1])
"""
)

SWAP_PLACE: Final = Script(
    """
-- Queue once, a newer copy replacing the queued one (lock/places.py).
-- KEYS[1] the queue place; ARGV[1] the new value (token|holder); ARGV[2] ttl in ms;
-- ARGV[3..] the holders it may name (task ids of copies replaced or started)
-- returns 1 when the place named one of them, was free, or already held ARGV[1], and
--         now holds ARGV[1] for ttl; 0 when it names another copy (left untouched)
local held = redis.call('get', KEYS[1])
if held == ARGV[1] then
  return 1
end
if held then
  local bar = string.find(held, '|', 1, true)
  local holder = bar and string.sub(held, bar + 1)
  local named = false
  for i = 3, #ARGV do
    if holder == ARGV[i] then
      named = true
    end
  end
  if not named then
    return 0
  end
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)

ALL_SCRIPTS: Final = (
    ACQUIRE,
    ACQUIRE_FENCED,
    FENCE,
    EXTEND,
    RELEASE,
    HOLDER,
    FORCE_RELEASE,
    REENTER,
    EXTEND_HOLD,
    EXTEND_VALUE,
    RELEASE_HOLD,
    *MULTI_SCRIPTS,
    *PERMIT_SCRIPTS,
    EXTEND_MANY,
    REGISTER_WAITER,
    POP_WAITER,
    CLAIM_WAITER,
    SWAP_PLACE,
)
# Every connection loads them in its handshake (wire/script.py), so the first EVALSHA
# of each finds its script.
preload(*ALL_SCRIPTS)
