"""The Lua scripts of limits and rates: a key's N permit slots on one node.

Split from scripts.py by feature; the same rules hold (each script atomic on its
node, a slot changed only after checking it holds our value). A key's slots are
ordinary lock keys named ``<key>\\0limit\\0<i>`` (a limit) or ``<key>\\0rate\\0<i>``
(a rate), i from 0 to N - 1 (permits.py names them); each holds one holder's value
exactly as a mutex key does. The scripts build the slot names from the prefix they
are given, so a key with a thousand permits costs one short command, and every slot
shares the key's prefix (one ACL pattern, and one cluster hash slot once the key is
hash-tagged). SAFETY.md "Limits (N at a time) and rates" says why any free slot
is safe and why each round starts its scan at a random one.

Two notes beside the slots keep a node from reading all N of them on the common
paths (a thousand GETs block a node for milliseconds): the *grant* of a token (which
slot this node gave it, as long as that slot was set to live) answers a resent
acquire, an undo and a release at once; the *full* note (every slot taken, until the
first of them expires; deleted with any slot) answers a refusal. Neither ever grants:
a slot is taken only where GET found it free, as before.

Imports wire/script.py and stored.py only.
"""

from __future__ import annotations

from typing import Final

from ..wire.script import Script
from .stored import DROPPED, FENCE, RATE, RELEASED, lua_text, publish_wake

__all__ = ["ACQUIRE_PERMIT", "DROP_PERMITS", "PERMIT_SCRIPTS", "RELEASE_PERMIT"]

ACQUIRE_PERMIT: Final = Script(
    """
-- KEYS[1] the key's terms record (what every caller of the key must agree on: the
-- limit N, or a rate's R/period); KEYS[2] the tombstone of our token for its slots;
-- KEYS[3] a limit's key itself (held there: a caller takes it as a mutex), a rate's
-- turns (when the next reserved turn is, in this node's ms); KEYS[4] the note that
-- every slot is taken (the soonest slot's holder, as long as that slot lives);
-- KEYS[5] our token's grant (the slot this node gave it)
-- ARGV[1] our value; ARGV[2] ttl in ms; ARGV[3] N slots; ARGV[4] the slots' name
-- prefix (slot i is ARGV[4] .. i); ARGV[5] '1' when fenced; ARGV[6] the terms;
-- ARGV[7] where this round's scan starts (0..N-1, the caller's random pick: every
-- node starts there for this caller, racing callers start apart); ARGV[8] a rate's
-- spacing in ms (a slot's lifetime / R) when the caller reserves a turn, else 0;
-- ARGV[9] 'limit' or 'rate'
-- returns {1, counter, i}: slot i was free (the first free one from the start, in
--           order, wrapping) and now holds our value for ttl, or already held it
--           (the same call resent); counter: the slot's fence counter when
--           fenced, else 0;
--         {false, -4, holder value, pttl, turn}: every slot is taken; the slot
--           that frees first, and when; turn: with a reservation, in how many ms
--           the caller's turn comes (not before that slot frees, a spacing after
--           the turn handed out before it: copies that come back at their turns
--           arrive at the rate, not all at once), else -1;
--         {false, -3, terms}: the record names other terms, or '1' when the key is
--           held as a mutex (callers disagree);
--         {false, -2}: our own release already passed by (a late call: nothing set)
local terms = redis.call('get', KEYS[1])
if terms and terms ~= ARGV[6] then
  return {false, -3, terms}
end
local rate = ARGV[9] == 'KIND_RATE'
if not rate and redis.call('exists', KEYS[3]) == 1 then
  return {false, -3, '1'}
end
if redis.call('exists', KEYS[2]) == 1 then
  return {false, -2}
end
local ttl = tonumber(ARGV[2])
local function granted(i, slot)
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('set', KEYS[1], ARGV[6], 'PX', ttl)
  end
  local counter = 0
  if ARGV[5] == '1' then
    counter = tonumber(redis.call('get', slot .. 'FENCE') or '0')
  end
  return {1, counter, i}
end
local mine = redis.call('get', KEYS[5])
if mine and redis.call('get', ARGV[4] .. mine) == ARGV[1] then
  return granted(tonumber(mine), ARGV[4] .. mine)
end
local soonest = redis.call('get', KEYS[4])
local soonest_ttl = -1
if soonest then
  soonest_ttl = redis.call('pttl', KEYS[4])
else
  local n = tonumber(ARGV[3])
  local start = tonumber(ARGV[7])
  for step = 0, n - 1 do
    local i = (start + step) % n
    local slot = ARGV[4] .. i
    local held = redis.call('get', slot)
    if not held or held == ARGV[1] then
      if not held then
        redis.call('set', slot, ARGV[1], 'PX', ttl)
      end
      redis.call('set', KEYS[5], i, 'PX', ttl)
      return granted(i, slot)
    end
    local left = redis.call('pttl', slot)
    if soonest_ttl < 0 or left < soonest_ttl then
      soonest, soonest_ttl = held, left
    end
  end
  if soonest_ttl > 0 then
    redis.call('set', KEYS[4], soonest, 'PX', soonest_ttl)
  end
end
local turn = -1
local spacing = tonumber(ARGV[8] or '0')
if spacing > 0 and rate then
  local time = redis.call('time')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local at = math.max(tonumber(redis.call('get', KEYS[3]) or '0'), now + soonest_ttl)
  redis.call('set', KEYS[3], at + spacing, 'PX', at + spacing - now + ttl)
  turn = at - now
end
return {false, -4, soonest, soonest_ttl, turn}
""".replace("FENCE", lua_text(FENCE)).replace("KIND_RATE", RATE),
    names=(4,),
)

RELEASE_PERMIT: Final = Script(
    """
-- KEYS[1] a slot; KEYS[2] the tombstone of our token for the key's slots; KEYS[3]
-- the key's terms record (its N: the slots to look through); KEYS[4] the note that
-- every slot is taken; KEYS[5] our token's grant (ACQUIRE_PERMIT)
-- ARGV[1] our value; ARGV[2] tombstone ttl in ms; ARGV[3] the key (its wake channel);
-- ARGV[4] the slots' name prefix
-- returns 1 when the slot held our value and is now deleted; 0 when it was not ours
-- (untouched), and then a tombstone: our acquire may still be on its way, and it
-- would take whichever slot is free, so the tombstone covers every slot. Either way
-- our value goes from the slot this node gave it, if another: a node that answered
-- our acquire after the round was decided may have given us another slot than the
-- quorum's. Without a grant (it lapsed while the watchdog kept the lease) every
-- slot is looked through. A deletion frees the key's full note and is published
-- on its wake channel (a blocked acquirer of any of its permits wakes).
local released = 0
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  released = 1
else
  redis.call('set', KEYS[2], '1', 'PX', ARGV[2])
end
local dropped = released
local mine = redis.call('get', KEYS[5])
if mine then
  local slot = ARGV[4] .. mine
  if slot ~= KEYS[1] and redis.call('get', slot) == ARGV[1] then
    redis.call('del', slot)
    dropped = dropped + 1
  end
  redis.call('del', KEYS[5])
else
  local n = tonumber(string.match(redis.call('get', KEYS[3]) or '0', '^%d+')) or 0
  for i = 0, n - 1 do
    local slot = ARGV[4] .. i
    if slot ~= KEYS[1] and redis.call('get', slot) == ARGV[1] then
      redis.call('del', slot)
      dropped = dropped + 1
    end
  end
end
if dropped > 0 then
  redis.call('del', KEYS[4])
  WAKE(ARGV[3])
end
return released
""".replace("WAKE(ARGV[3])", publish_wake("ARGV[3]", RELEASED)),
    names=(3, 4),
)

DROP_PERMITS: Final = Script(
    """
-- KEYS[1] the tombstone of our token for the key's slots; KEYS[2] the note that
-- every slot is taken; KEYS[3] our token's grant (ACQUIRE_PERMIT)
-- ARGV[1] our value; ARGV[2] tombstone ttl in ms; ARGV[3] the slots' name prefix;
-- ARGV[4] the slot to keep (-1: none); ARGV[5] the key (wake channel)
-- Deletes our value from the slot this node gave it, unless that is the one kept:
-- the undo of a lost round (keep -1, which also leaves the tombstone, so a late
-- acquire sets nothing), or the clean-up after a won round where this node gave us
-- another slot than the quorum. It comes right after the round: a grant this node
-- made lives as long as its slot, so no grant means no slot of ours here.
-- returns how many slots it deleted (0 or 1; a deletion frees the full note and
-- is published on the key's wake channel).
local keep = tonumber(ARGV[4])
local dropped = 0
local mine = redis.call('get', KEYS[3])
if mine and tonumber(mine) ~= keep then
  local slot = ARGV[3] .. mine
  if redis.call('get', slot) == ARGV[1] then
    redis.call('del', slot)
    dropped = 1
  end
  redis.call('del', KEYS[3])
end
if dropped > 0 then
  redis.call('del', KEYS[2])
  WAKE(ARGV[5])
end
if keep < 0 then
  redis.call('set', KEYS[1], '1', 'PX', ARGV[2])
end
return dropped
""".replace("WAKE(ARGV[5])", publish_wake("ARGV[5]", DROPPED)),
    names=(3, 5),
)

PERMIT_SCRIPTS: Final = (ACQUIRE_PERMIT, RELEASE_PERMIT, DROP_PERMITS)
