"""The fleet coordinator on Redis (protocol v3): one atomic Lua script per step, keys that expire.

Strictly private: import these names from :mod:`fsm.fleet`.

Durations in, time left out: a cooldown is a key with a ``PX`` expiry and its time left is
its ``PTTL``; everything else that needs a time (the bucket's idle time, the pacer, the
budget floor, the credential marks) is counted on the server's own clock (``TIME`` inside the
script), never on one machine's wall time, so a machine whose clock is wrong cannot stretch
or shorten anyone's wait.

Keys (``P`` is the prefix, each part percent-encoded so that ``:`` in a model name cannot
make two keys collide). The keys of one (provider, model, credential) share the Redis Cluster
hash tag ``{PROVIDER:MODEL:CRED}``, so each script touches one slot and a Redis Cluster (or a
Valkey cluster) can serve a fleet:

- ``P:{T}:cooldown`` — a string with a ``PX`` expiry: the cooldown (time left = ``PTTL``);
- ``P:{T}:fallback`` — a string with a ``PX`` expiry: the fallback mark of the primary model;
- ``P:{T}:bucket`` — a hash ``{m: milli-tokens, t: last use (server ms)}``: the retry budget.
  Never deleted when full; it expires after :data:`BUCKET_TTL_MS` without use. A bucket this
  process has used within ``bucket_idle_ms`` that is gone (evicted, flushed, a restart) counts
  as spent; a bucket nobody has seen, or idle for ``bucket_idle_ms``, is full;
- ``P:{T}:floor`` — a string: the budget floor's next free slot (server ms);
- ``P:{T}:pacer`` — a hash: the pacer's state (:class:`fsm.core.pacing.PacerState`, one
  field each, times in server ms; see ``_LUA_PACER`` for the field names). Every admission
  with pacing on writes it (the send is counted even while not pacing), and every answer
  observed; it expires :func:`pacer_ttl_ms` after its last write: ``forgetAfterMs`` (after
  which the pacer lets go anyway) plus :data:`PACER_MEMORY_HALF_LIVES` half-lives of the best
  throughput remembered (``memoryS``; after them that memory is a sixteenth of what it was)
  plus a minute. A lost hash is a fresh pacer (not pacing, nothing remembered);
- ``P:limited:PROVIDER`` — a sorted set of credential ids scored by the end of their usage
  limit (server ms); it expires with its last mark;
- ``P:processes`` — a sorted set of the fleet's process ids scored by their last heartbeat.

On a Redis Cluster (``redis+cluster://HOST:PORT,HOST:PORT``, SPEC §15.10 and §15.13) the
names are the same: each script's keys share one slot, a batch of calls holds one key's only,
and the credential marks, read on one Redis by a pipeline with ``TIME``, are read by a
one-key script (a cluster pipeline cannot send ``TIME``).

Every value read is validated per key: a key of the wrong type, a non-number, a number out
of range (a time left beyond :data:`~fsm.fleet.MAX_LEFT_MS`, a cooldown without expiry) is
treated as absent and repaired by the next write; it never fails the script, so one bad key
never makes the coordinator look down.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import time
import urllib.parse
import uuid
import weakref
from typing import Any

from fsm._extras import require
from fsm.core import pacing as pacing_core
from fsm.core.settings import PacingSettings
from fsm.fleet._local import DEFAULT_BUCKET_IDLE_MS, FLOOR_HORIZON_MS, WAIT_RECHECK_MS, floor_interval_ms
from fsm.fleet._types import (MAX_LEFT_MS, MILLI, Admission, BudgetSettings, CoordinatorError, CoordinatorKeyError,
                              CoordinatorSlowError, CoordKey, check_duration, check_ms, clamp_left, max_milli,
                              ratio_milli)

DEFAULT_PREFIX = "retry-fsm"

#: At most this many cooldowns are kept per process (:meth:`RedisCoordinator.cooldown_left`).
_MAX_KEPT_COOLDOWNS = 10_000

log = logging.getLogger("fsm.fleet")

#: A bucket nobody used for this long disappears from Redis (it is full again long before).
BUCKET_TTL_MS = 7 * 86_400_000

#: The pacer hash outlives its last write by this many half-lives (``memoryS``) of the best
#: throughput it remembers, beyond ``forgetAfterMs`` (:func:`pacer_ttl_ms`).
PACER_MEMORY_HALF_LIVES = 4

#: A script call holds this many requests of one key (:meth:`RedisCoordinator.admit`
#: coalesces the calls of one event-loop iteration): a batch keeps Redis busy about a
#: millisecond, so other keys' scripts and a probe are not held up behind it. When the calls
#: of one iteration would need more script calls than the coordinator has connections
#: (``max_connections``), the batches grow instead (:func:`batch_size`), so that every batch
#: is sent at once: a batch waiting for a connection waits for the loop to read another's
#: reply, which a busy loop does late (10,000 callers: a fifth of them "unknown").
BATCH_MAX = 256


def batch_size(requests: int, connections: int) -> int:
    """How many requests go in one script call when ``requests`` wait in one loop iteration
    and ``connections`` commands may run at once: :data:`BATCH_MAX`, or more where that would
    take more script calls than ``connections`` (``requests`` ÷ ``connections``, rounded up)."""
    return max(BATCH_MAX, -(-requests // max(1, connections)))

#: A process's heartbeat (:meth:`RedisCoordinator.processes`) counts for this long.
PROCESS_TTL_MS = 30_000


def pacer_ttl_ms(pacing: PacingSettings) -> int:
    """How long the pacer hash of a key outlives its last write, in ms:
    ``forgetAfterMs`` + :data:`PACER_MEMORY_HALF_LIVES` × ``memoryS`` × 1000 + one minute.
    Within ``forgetAfterMs`` a pacer that paces keeps its rate and slots; beyond it the pacer
    has let go anyway and only the best throughput remembered (fast recovery) is lost, once it
    has decayed to a sixteenth."""
    return pacing.forget_after_ms + math.ceil(PACER_MEMORY_HALF_LIVES * pacing.memory_s * 1000) + 60_000


# Shared by every script: ARGV[1] is MAX_LEFT_MS, ARGV[2] the time ('' = the server's TIME;
# tests give one to compare the arithmetic with fsm.core.pacing).
_LUA_COMMON = """
if redis.replicate_commands then pcall(redis.replicate_commands) end -- TIME, then writes (Redis < 7)
local MAXLEFT = tonumber(ARGV[1])
local function num(v)
  if type(v) ~= 'string' and type(v) ~= 'number' then return nil end
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end
local NOW
if ARGV[2] ~= '' then NOW = tonumber(ARGV[2]) else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ktype(k) return redis.call('TYPE', k)['ok'] end
local function left(k)
  local ty = ktype(k)
  if ty == 'none' then return 0 end
  if ty ~= 'string' then redis.call('DEL', k) return 0 end
  local ttl = redis.call('PTTL', k)
  if ttl < 0 or ttl > MAXLEFT then redis.call('DEL', k) return 0 end
  return ttl
end
local function extend(k, d)
  if d <= 0 then return left(k) end
  local old = left(k)
  if d > old then redis.call('SET', k, '1', 'PX', string.format('%d', d)) return d end
  return old
end
local function fmt(x) return string.format('%.17g', x) end
"""

# Budget: ARGV[a] max milli ('' = none), [a+1] seen (0/1), [a+2] idle ms, [a+3] ttl ms.
_LUA_BUCKET = """
local function bucket_get(k, max, seen, idle)
  local ty = ktype(k)
  local m, t = nil, nil
  if ty == 'hash' then
    local v = redis.call('HMGET', k, 'm', 't')
    m = num(v[1]) t = num(v[2])
  elseif ty ~= 'none' then redis.call('DEL', k) end
  if m == nil then
    if seen == '1' then m = 0 else m = max end
    t = NOW
  end
  if t == nil or t > NOW or t < NOW - MAXLEFT then t = NOW end
  if NOW - t >= idle then m = max end
  if m < 0 then m = 0 end
  if m > max then m = max end
  return math.floor(m)
end
local function bucket_set(k, m, ttl)
  if ktype(k) ~= 'hash' then redis.call('DEL', k) end
  redis.call('HSET', k, 'm', string.format('%d', m), 't', string.format('%d', NOW))
  redis.call('PEXPIRE', k, ttl)
end
"""

# The pacer: fsm.core.pacing's arithmetic, in the same order of operations (so the same
# doubles; the growth factors' log1p, which Lua 5.1 lacks, is computed in Python and sent
# exactly). ARGV[p..p+9] (:meth:`RedisCoordinator._pacing_args`): min_rate ('' = pacing off),
# max_rate ('' none), beta, log1p(growth_per_s), log1p(fast_growth_per_s), cut_interval_ms,
# horizon_ms, forget_after_ms, memory_s, the pacer hash's TTL in ms (:func:`pacer_ttl_ms`).
# The hash's fields are PacerState's: on (0/1), rate, tat, lcut (last_cut_ms), lgrow
# (last_grow_ms), wmax, good, goodt (good_ms), oks (ok_sec), okn (ok_n), sents (sent_sec),
# sentc (sent_cur), sentp (sent_prev), seen (seen_ms), thrs (thr_sec), thrc (thr_cur), thrp
# (thr_prev), okp (ok_prev); times in server ms, written with 17
# digits. PNOW is the pacer's time: NOW clamped to the latest time seen (a server clock that
# stepped back, e.g. a failover: no reset, no time passes; fsm.core.pacing "clock steps").
_LUA_PACER = """
local ENGAGE_EXCESS = @ENGAGE_EXCESS@
local PFIELDS = {'on', 'rate', 'tat', 'lcut', 'lgrow', 'wmax', 'good', 'goodt', 'oks', 'okn',
                 'sents', 'sentc', 'sentp', 'seen', 'thrs', 'thrc', 'thrp', 'okp'}
local PEMPTY = {thrs=-1, thrc=0, thrp=0, okp=0}
local PNOW = NOW
local function pfresh()
  PNOW = NOW
  return {on=0, rate=0, tat=0, lcut=0, lgrow=0, wmax=0, good=0, goodt=0, oks=-1, okn=0,
          sents=-1, sentc=0, sentp=0, seen=-math.huge, thrs=-1, thrc=0, thrp=0, okp=0}
end
local function count_ok(x) return x >= 0 and x <= 1e9 end
local function second_ok(x, hi) return x == math.floor(x) and x >= -1 and x * 1000 <= hi end
local function pacer_get(k)
  local ty = ktype(k)
  if ty == 'none' then return pfresh() end
  if ty ~= 'hash' then redis.call('DEL', k) return pfresh() end
  local v = redis.call('HMGET', k, unpack(PFIELDS))
  local s = {}
  for i, f in ipairs(PFIELDS) do
    local n = num(v[i])
    -- a hash written before the throttles' window (or the second before oks) was kept:
    -- that window is empty
    if n == nil and v[i] == false and PEMPTY[f] ~= nil then n = PEMPTY[f] end
    if n == nil then return pfresh() end
    s[f] = n
  end
  -- the latest time seen: a server clock behind it by up to 400 days stepped back (clamped
  -- to it); further is another clock (a peer writing microseconds, a corrupted key). Times
  -- written as the pacer's time (a cut, a growth step, a success) are not after the latest
  -- time seen; slots (tat, the newest send's second) may be booked up to a cooldown or
  -- backoff of 400 days ahead, plus the horizon
  local soon, far = s.seen, s.seen + 2 * MAXLEFT
  if s.seen > NOW + MAXLEFT or (s.on ~= 0 and s.on ~= 1) or not count_ok(s.rate)
     or (s.on == 1 and s.rate <= 0)
     or s.tat > far or s.lcut > soon or s.lgrow > soon or s.goodt > soon
     or not count_ok(s.wmax) or not count_ok(s.good) or not count_ok(s.okn)
     or not count_ok(s.sentc) or not count_ok(s.sentp)
     or not count_ok(s.thrc) or not count_ok(s.thrp) or not count_ok(s.okp)
     or not second_ok(s.oks, soon) or not second_ok(s.sents, far)
     or not second_ok(s.thrs, soon) then
    return pfresh()
  end
  PNOW = math.max(NOW, s.seen)
  return s
end
local function pacer_set(k, s, ttl)
  if ktype(k) ~= 'hash' then redis.call('DEL', k) end
  local args = {}
  for _, f in ipairs(PFIELDS) do args[#args + 1] = f args[#args + 1] = fmt(s[f]) end
  redis.call('HSET', k, unpack(args))
  redis.call('PEXPIRE', k, ttl)
end
local function pacer_forget(s, p)
  if s.on == 1 and PNOW - s.lcut > p.forget then s.on = 0 s.rate = 0.0 s.tat = 0.0 end
end
-- one more in a sliding window of two seconds: fields w..'s' (the newest second), w..'c'
-- (its count), w..'p' (the second before's); w is 'sent' (sends) or 'thr' (throttles)
local function count_in(s, w, at)
  local fs, fc, fp = w .. 's', w .. 'c', w .. 'p'
  local sec = math.floor(at / 1000.0)
  if sec <= s[fs] then s[fc] = s[fc] + 1.0 return end
  local prev = 0.0
  if sec == s[fs] + 1.0 then prev = s[fc] end
  s[fs] = sec s[fc] = 1.0 s[fp] = prev
end
local function count_send(s, at) count_in(s, 'sent', at) end
local function count_throttle(s, at) count_in(s, 'thr', at) end
local function window_rate(newest, cur, prev)
  local sec = math.floor(PNOW / 1000.0)
  if sec > newest + 1.0 or newest < 0 then return 0.0 end
  local frac = (PNOW - sec * 1000.0) / 1000.0
  if sec == newest + 1.0 then return cur * (1.0 - frac) end
  if sec == newest then return prev * (1.0 - frac) + cur end
  return prev + cur
end
local function send_rate(s) return window_rate(s.sents, s.sentc, s.sentp) end
local function throttle_rate(s) return window_rate(s.thrs, s.thrc, s.thrp) end
local function best_rate(s, p)
  if s.good <= 0.0 then return 0.0 end
  return s.good * 0.5 ^ (math.max(0.0, PNOW - s.goodt) / 1000.0 / p.memory)
end
local function pacer_cap(rate, p)
  if p.max ~= nil then rate = math.min(rate, p.max) end
  rate = math.min(rate, 1000000.0)
  return math.max(rate, p.min)
end
-- Reserves in s (changed in place): the delay in ms, or nil (no slot within the horizon:
-- nothing reserved or counted; s is then to be dropped, not written).
local function pacer_reserve(s, p, earliest)
  earliest = math.max(0.0, earliest)
  pacer_forget(s, p)
  s.seen = PNOW
  local want = PNOW + earliest
  local at = want
  if s.on == 1 then
    at = math.max(want, s.tat)
    if at - want > p.horizon then return nil end
    s.tat = at + 1000.0 / s.rate
  end
  local booked = math.ceil(at)
  count_send(s, booked)
  return math.floor(math.min(MAXLEFT, booked - PNOW))
end
-- outcome: 't' throttled, 's' a success, anything else an answer that teaches nothing.
local function pacer_observe(s, outcome, p)
  pacer_forget(s, p)
  s.seen = PNOW
  if outcome == 't' then
    count_throttle(s, PNOW)
    if s.on == 1 and PNOW - s.lcut < p.cut then return s end
    -- a lone throttle (at most fsm.core.pacing.ENGAGE_EXCESS a second heard) does not
    -- engage pacing (SPEC 15.7)
    if s.on ~= 1 and throttle_rate(s) <= ENGAGE_EXCESS then return s end
    local measured = send_rate(s)
    local through
    if measured > 0.0 then through = math.max(0.0, measured - throttle_rate(s))
    elseif s.on == 1 then through = s.rate
    else through = 0.0 end
    local base = through
    if s.on == 1 then base = math.min(s.rate, through) end
    local rate = pacer_cap(p.beta * base, p)
    if s.on == 1 and s.rate <= p.min and s.oks < math.floor(s.lcut / 1000.0) then
      rate = math.max(p.min * 0.25, p.beta * s.rate)
    end
    s.on = 1 s.rate = rate s.wmax = base
    s.lcut = PNOW s.lgrow = PNOW s.tat = math.max(s.tat, PNOW)
    return s
  end
  if outcome ~= 's' then return s end
  local sec = math.floor(PNOW / 1000.0)
  local good, goodt, okn, okp = s.good, s.goodt, s.okn, s.okp
  if sec ~= s.oks then
    local sustained = math.min(okn, okp)
    if sustained > best_rate(s, p) then good = sustained goodt = PNOW end
    if sec == s.oks + 1.0 then okp = okn else okp = 0.0 end
    okn = 0.0
  end
  s.good = good s.goodt = goodt s.oks = sec s.okn = okn + 1.0 s.okp = okp
  if s.on ~= 1 then return s end
  local rate, wmax = s.rate, s.wmax
  local best = best_rate(s, p)
  if rate < best / 2.0 and throttle_rate(s) <= 2.0 * p.min then
    if rate <= 2.0 * p.min then wmax = math.max(wmax, best) end
    rate = best / 2.0
  end
  local dt = PNOW - s.lgrow
  if dt > 0 and send_rate(s) >= rate / 2.0 then
    local knee = 0.9 * wmax
    if rate < knee then
      rate = math.min(knee, rate * math.exp(p.lgfast * math.min(dt, 1000.0) / 1000.0))
    else
      rate = rate * math.exp(p.lgslow * math.min(dt, 1000.0) / 1000.0)
    end
  end
  s.rate = pacer_cap(rate, p) s.wmax = wmax s.lgrow = PNOW
  return s
end
local function pacing_args(i)
  if ARGV[i] == '' then return nil end
  local p = {min=tonumber(ARGV[i]), beta=tonumber(ARGV[i + 2]), lgslow=tonumber(ARGV[i + 3]),
             lgfast=tonumber(ARGV[i + 4]), cut=tonumber(ARGV[i + 5]),
             horizon=tonumber(ARGV[i + 6]), forget=tonumber(ARGV[i + 7]),
             memory=tonumber(ARGV[i + 8]), ttl=ARGV[i + 9]}
  if ARGV[i + 1] ~= '' then p.max = tonumber(ARGV[i + 1]) end
  return p
end
""".replace("@ENGAGE_EXCESS@", repr(pacing_core.ENGAGE_EXCESS))

# KEYS cooldown, bucket, floor, pacer (one key's: one slot). ARGV[3..6] budget (max milli or
# '' none, seen, idle, ttl), [7] mode, [8] floor interval ms ('' none), [9..18] pacing, [19]
# the re-check of a wait with no floor slot booked (ms, WAIT_RECHECK_MS), [20] the floor's
# horizon in wait mode (ms, FLOOR_HORIZON_MS: a slot starting later is not reserved), [21] the
# number n of requests, then n blocks of five from ARGV[22]: retry (0/1), earliest_ms,
# floor_slot_due (0/1), max_wait_ms ('' none), the cooldown the caller's process knows is left
# (ms, 0 none: a cooldown key that is shorter or gone — evicted, flushed — is written back
# with it, as a bucket the process saw is). The n requests are admitted in order, each as
# one atomic step would on its own at the same NOW (a batch of one is the single step; the
# key's state is read once and written once). Returns n blocks of seven: {cooldown_ms, allowed
# (1/0/-1 none), token_taken, pacing_ms, budget_wait_ms, milli-tokens (-1 none),
# budget_slot_booked (1/0)}; pacing_ms is -1 when the pacer has no slot within its horizon
# (nothing taken, reserved or counted: the block is {cooldown_ms, -1, 0, -1, 0, -1, 1});
# budget_slot_booked is 0 only when wait mode reserved no floor slot (no floor, or none within
# the horizon: budget_wait_ms is then ARGV[19]).
ADMIT = _LUA_COMMON + _LUA_BUCKET + _LUA_PACER + """
local cooldown = left(KEYS[1])
local p = pacing_args(9)
local max, interval = num(ARGV[3]), num(ARGV[8])
local s, m, tat = nil, nil, nil  -- the pacer, the bucket, the floor: read at first use
local pacer_dirty, floor_dirty = false, false
local function pcopy(t) local c = {} for k, v in pairs(t) do c[k] = v end return c end
-- reserves the floor's next slot when it starts within `limit` ms of NOW: its delay, or nil
local function floor_slot(limit)
  if interval == nil then return nil end
  if not floor_dirty and tat == nil then
    local ty = ktype(KEYS[3])
    if ty == 'string' then tat = num(redis.call('GET', KEYS[3]))
    elseif ty ~= 'none' then redis.call('DEL', KEYS[3]) end
    if tat == nil or tat > NOW + MAXLEFT then tat = NOW end
  end
  local start = math.max(NOW, tat)
  if start - NOW > limit then return nil end
  tat = start + interval
  floor_dirty = true
  return start - NOW
end
local function one(b)
  local known = tonumber(ARGV[b + 4])
  if known > cooldown then cooldown = extend(KEYS[1], known) end
  if ARGV[b + 3] ~= '' and cooldown > tonumber(ARGV[b + 3]) then return {cooldown, -1, 0, 0, 0, -1, 1} end
  local ns, pacing = nil, 0
  if p ~= nil then  -- the pacer first: no slot within the horizon, nothing is taken
    if s == nil then s = pacer_get(KEYS[4]) end
    ns = pcopy(s)
    pacing = pacer_reserve(ns, p, math.max(tonumber(ARGV[b + 1]), cooldown))
    if pacing == nil then return {cooldown, -1, 0, -1, 0, -1, 1} end
  end
  local allowed, taken, wait, milli, booked = -1, 0, 0, -1, 1
  if ARGV[b] == '1' and max ~= nil then
    if m == nil then m = bucket_get(KEYS[2], max, ARGV[4], tonumber(ARGV[5])) end
    local after = m - 1000
    if after < 0 then after = 0 end
    if after * 2 > max then
      m = after allowed = 1 taken = 1
    elseif ARGV[b + 2] == '1' then
      allowed = 1
    elseif ARGV[7] ~= 'wait' then
      m = after
      if floor_slot(0) ~= nil then allowed = 1 else allowed = 0 end
    else
      local w = floor_slot(tonumber(ARGV[20]))
      if w == nil then allowed = 0 wait = tonumber(ARGV[19]) booked = 0
      elseif w <= 0 then allowed = 1
      else allowed = 0 wait = math.min(MAXLEFT, math.ceil(w)) end
    end
    milli = m
  end
  if ns ~= nil and allowed ~= 0 then s = ns pacer_dirty = true else pacing = 0 end
  return {cooldown, allowed, taken, pacing, wait, milli, booked}
end
local out = {}
for i = 0, tonumber(ARGV[21]) - 1 do
  for _, v in ipairs(one(22 + 5 * i)) do out[#out + 1] = v end
end
if m ~= nil then bucket_set(KEYS[2], m, ARGV[6]) end
if floor_dirty then
  redis.call('SET', KEYS[3], fmt(tat), 'PX', string.format('%d', math.ceil(tat - NOW) + 60000))
end
if pacer_dirty then pacer_set(KEYS[4], s, p.ttl) end
return out
"""

# KEYS bucket, pacer. ARGV[3..6] budget (max milli or '', seen, idle, ttl), [7..16] pacing,
# [17] the number n of answers, then n blocks of two from ARGV[18]: milli-tokens to add ('0':
# none), the answer for the pacer ('t' throttled, 's' a success, 'o' any other answer, '' =
# no answer to count). Each in order, as one step each would at the same NOW: a success's
# credit or a returned token, capped at the maximum (a full bucket stays); the answer
# observed by the pacer. Returns n milli-token counts, one after each (-1 none).
CREDIT = _LUA_COMMON + _LUA_BUCKET + _LUA_PACER + """
local max = num(ARGV[3])
local m, s = nil, nil
if max ~= nil then m = bucket_get(KEYS[1], max, ARGV[4], tonumber(ARGV[5])) end
local p = pacing_args(7)
local out = {}
for i = 0, tonumber(ARGV[17]) - 1 do
  local b = 18 + 2 * i
  if m ~= nil then
    m = m + tonumber(ARGV[b])
    if m > max then m = max end
  end
  if p ~= nil and ARGV[b + 1] ~= '' then
    if s == nil then s = pacer_get(KEYS[2]) end
    s = pacer_observe(s, ARGV[b + 1], p)
  end
  out[#out + 1] = m or -1
end
if m ~= nil then bucket_set(KEYS[1], m, ARGV[6]) end
if s ~= nil then pacer_set(KEYS[2], s, p.ttl) end
return out
"""

# KEYS[1] a cooldown or fallback key; ARGV[3] duration ms. The later end wins. Returns the
# time left after.
LEARN = _LUA_COMMON + """
return extend(KEYS[1], tonumber(ARGV[3]))
"""

# KEYS[1] a cooldown or fallback key. Returns its validated time left (a bad key: 0, deleted).
LEFT = _LUA_COMMON + """
return left(KEYS[1])
"""

# KEYS[1] limited set; ARGV[3] credential id, [4] duration ms. Drops ended and absurd marks,
# keeps the later end of this one (server ms), expires with its last mark. Returns the count.
MARK_LIMITED = _LUA_COMMON + """
local ty = ktype(KEYS[1])
if ty ~= 'none' and ty ~= 'zset' then redis.call('DEL', KEYS[1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', NOW))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', NOW + MAXLEFT), '+inf')
local d = tonumber(ARGV[4])
if d > 0 then
  local u = NOW + d
  local old = num(redis.call('ZSCORE', KEYS[1], ARGV[3])) or 0
  if u > old then redis.call('ZADD', KEYS[1], string.format('%d', u), ARGV[3]) end
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.max(1, tonumber(last[2]) - NOW)))
end
return redis.call('ZCARD', KEYS[1])
"""

# KEYS[1] the fleet's process set (a sorted set: process id -> its last heartbeat, server ms);
# ARGV[3] this process's id, [4] how long a heartbeat counts (ms). Drops the processes not
# heard within it and returns how many are left (this one included).
PROCESSES = _LUA_COMMON + """
local ty = ktype(KEYS[1])
if ty ~= 'none' and ty ~= 'zset' then redis.call('DEL', KEYS[1]) end
local ttl = tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], string.format('%d', NOW), ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', NOW - ttl))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', NOW + ttl), '+inf')
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
"""

# KEYS[1] a provider's limited set. Returns {seconds, microseconds (the server's TIME), the
# key's TYPE, its members and scores (ZRANGE WITHSCORES, flat; {} when not a zset)}: the
# read of queue_limited_read in one script, for a Redis Cluster (whose pipelines cannot send
# TIME; the script runs on the node that holds the key, so its clock is the one the marks
# were written by).
LIMITED_READ = """
local t = redis.call('TIME')
local ty = redis.call('TYPE', KEYS[1])['ok']
local rows = {}
if ty == 'zset' then rows = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES') end
return {t[1], t[2], ty, rows}
"""

SCRIPTS = {"admit": ADMIT, "credit": CREDIT, "learn": LEARN, "left": LEFT, "mark": MARK_LIMITED,
           "processes": PROCESSES, "limited": LIMITED_READ}


def _part(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class KeySpace:
    """The Redis key names under ``prefix`` (a non-empty string without spaces)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
            raise ValueError(f"Redis key prefix must be a non-empty string without spaces, got {prefix!r}")
        self.prefix = prefix
        self._tags: dict[CoordKey, str] = {}  # key -> its hash-tagged name stem (at most 4,096)

    def _tag(self, key: CoordKey) -> str:
        tag = self._tags.get(key)
        if tag is None:  # percent-encoding each call cost a tenth of an admission's CPU
            if len(self._tags) >= 4096:
                self._tags.clear()
            tag = self._tags[key] = (f"{self.prefix}:{{{_part(key.provider)}:{_part(key.model)}:"
                                     f"{_part(key.credential)}}}")
        return tag

    def cooldown(self, key: CoordKey) -> str:
        return self._tag(key) + ":cooldown"

    def fallback(self, key: CoordKey) -> str:
        return self._tag(key) + ":fallback"

    def bucket(self, key: CoordKey) -> str:
        return self._tag(key) + ":bucket"

    def floor(self, key: CoordKey) -> str:
        return self._tag(key) + ":floor"

    def pacer(self, key: CoordKey) -> str:
        return self._tag(key) + ":pacer"

    def of(self, key: CoordKey) -> list[str]:
        """Every key of ``key``'s hash tag (cooldown, fallback, bucket, floor, pacer)."""
        return [self.cooldown(key), self.fallback(key), self.bucket(key), self.floor(key),
                self.pacer(key)]

    def limited(self, provider: str) -> str:
        return f"{self.prefix}:limited:{_part(provider)}"

    def processes(self) -> str:
        """The fleet's process set (heartbeats: :meth:`RedisCoordinator.processes`)."""
        return f"{self.prefix}:processes"


def redact_url(url: str) -> str:
    """``url`` with its password and credential parameters (``?password=``) replaced by
    ``***``: safe for errors and logs (:func:`fsm.core.redact.redact_url`)."""
    from fsm.core.redact import redact_url as redact
    return redact(url)


#: The schemes of a Redis Cluster address (``rediss+cluster`` with TLS), SPEC §15.13.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster_url(url: Any) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return isinstance(url, str) and url.split("://", 1)[0] in CLUSTER_SCHEMES


def check_url(url: Any) -> str:
    """A Redis address (SPEC §15.13 "Redis URLs"), or ``ValueError`` naming it (password
    hidden). One Redis: ``redis://HOST:PORT/DB``, ``rediss://`` (TLS), ``unix:///path.sock``;
    a port that is not 0..65535 or a database (the path, ``?db=N``) that is not a whole
    number is refused (redis-py would quietly use database 0 for ``redis://host/abc``). A
    Redis Cluster: ``redis+cluster://HOST:PORT,HOST:PORT,...`` (``rediss+cluster://`` for
    TLS, ``USER:PASSWORD@`` before the first node applies to every node), any of its nodes
    (the client finds the others); a database other than 0, an empty node, a port that is
    not 1..65535 or another query parameter than ``db`` is refused."""
    if not isinstance(url, str) or not re.match(r"^(redis|rediss|unix|redis\+cluster|rediss\+cluster)://", url):
        shown = _shown(url) if isinstance(url, str) else repr(url)
        raise ValueError("Redis address must look like redis://HOST:PORT/DB (one Redis) or "
                         f"redis+cluster://HOST:PORT,HOST:PORT (a Redis Cluster), got {shown[:200]!r}")
    problem = _cluster_parts(url)[1] if is_cluster_url(url) else _url_problem(url)
    if problem and _userinfo_unclear(url):
        # a "/", "?" or "#" in a password ends the host for the URL's parser: what it read as
        # the host, path or query holds part of the password, so neither is shown
        problem = ("cannot tell the user name and password from the address: a '/', '?' or '#' "
                   "comes before the last '@' (write them as %2F, %3F, %23 in a password)")
    if problem:
        raise ValueError(f"Redis address {_shown(url)[:200]!r}: {problem}")
    return url


def _userinfo_unclear(url: str) -> bool:
    """Whether a ``/``, ``?`` or ``#`` comes before the last ``@`` of ``url`` (after its
    scheme): a password with one of them not percent-encoded, which a URL's parser reads as
    the end of the host."""
    rest = url.partition("://")[2] or url
    return bool(re.search(r"[/?#]", rest[:max(0, rest.rfind("@"))]))


def _shown(url: str) -> str:
    """``url`` safe for an error: :func:`redact_url`, and everything before the last ``@``
    masked when the parser cannot tell the password from the host (:func:`_userinfo_unclear`)."""
    if not _userinfo_unclear(url):
        return redact_url(url)
    scheme, sep, rest = url.partition("://")
    head, rest = (scheme + sep, rest) if sep else ("", url)
    return head + "***@" + redact_url(rest[rest.rfind("@") + 1:])


def _url_problem(url: str) -> str | None:
    """What is wrong with the parts of a ``redis``/``rediss``/``unix`` URL, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        return str(exc)
    dbs = urllib.parse.parse_qs(parts.query).get("db", [])
    if parts.scheme != "unix":
        if not parts.hostname:
            return "no host"
        if re.search(r"\s", parts.hostname):
            return f"a host name holds no space, got {parts.hostname[:60]!r}"
        path = urllib.parse.unquote(parts.path)
        if path not in ("", "/"):
            dbs.append(path[1:])
    for db in dbs:
        if not (db.isascii() and db.isdigit()):
            return f"the database must be a whole number (redis://HOST:PORT/0), got {db[:40]!r}"
    return None


def cluster_address(url: str) -> dict[str, Any]:
    """The client options of a checked ``redis+cluster://`` URL (:func:`check_url`):
    ``{"nodes": [(host, port), ...], "username", "password", "ssl"}``. ``ValueError`` as
    :func:`check_url`."""
    parts, problem = _cluster_parts(check_url(url))
    if problem or parts is None:
        raise ValueError(f"Redis address {_shown(url)[:200]!r}: {problem}")
    return parts


def _cluster_parts(url: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the options of :func:`cluster_address`, None) or (None, what is wrong)."""
    scheme, rest = url.split("://", 1)
    m = re.match(r"^([^/?#]*)([^?#]*)(?:\?([^#]*))?(?:#.*)?$", rest)
    if m is None:
        return None, "not a URL"
    netloc, path, query = m.group(1), urllib.parse.unquote(m.group(2)), m.group(3) or ""
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    nodes: list[tuple[str, int]] = []
    for node in hosts.split(","):
        hm = re.match(r"^(\[[0-9A-Fa-f:.]+\]|[^:\[\]\s]+)(?::([^:]*))?$", node.strip())
        if hm is None or not hm.group(1).strip("[]"):
            return None, (f"a cluster node must be HOST:PORT, got {node[:60]!r} (nodes are separated "
                          "by commas: redis+cluster://HOST:PORT,HOST:PORT)")
        port_text = hm.group(2)
        if port_text is None:
            port = 6379
        elif port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535:
            port = int(port_text)
        else:
            return None, f"the port of a cluster node must be 1..65535, got {port_text[:20]!r}"
        nodes.append((hm.group(1).strip("[]"), port))
    try:
        params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        return None, f"cannot read the query {query[:60]!r}"
    dbs = params.pop("db", [])
    if params:
        return None, (f"a Redis Cluster address takes no parameter but db, got "
                      f"{sorted(params)[0][:40]!r}")
    if path not in ("", "/"):
        dbs.append(path[1:])
    for db in dbs:
        if not (db.isascii() and db.isdigit()):
            return None, f"the database must be a whole number, got {db[:40]!r}"
        if int(db) != 0:
            return None, (f"a Redis Cluster has only database 0, got database {db[:40]!r} "
                          "(separate fleets on one cluster by their key prefix)")
    return {"nodes": nodes, "username": urllib.parse.unquote(username) or None,
            "password": urllib.parse.unquote(password) or None,
            "ssl": scheme == "rediss+cluster"}, None


def safe_reason(exc: BaseException, url: str | None = None) -> str:
    """A short description of ``exc`` for an event: the server's URL, the error's class and
    message, clipped, with every credential of the URL (``user:password@``, ``?password=``)
    and every registered secret removed (:mod:`fsm.core.redact`)."""
    from fsm.core.redact import scrub_secrets, url_secrets
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = text[:4096]
    if url:
        text = f"{redact_url(url)}: {text}"
    return scrub_secrets(text, url_secrets(url))[:300]


def cluster_client(url: str, socket_timeout_s: float, max_connections: int | None = None, *,
                   asyncio: bool = True) -> Any:
    """A redis-py ``RedisCluster`` (``redis.asyncio.cluster``'s, or the blocking one with
    ``asyncio=False``) for a ``redis+cluster://`` URL (:func:`cluster_address`), with
    :func:`client_options` and at most ``max_connections`` connections per node (None:
    redis-py's default). Connects lazily (it finds the other nodes at its first command).
    ``ValueError`` for a bad URL."""
    address = cluster_address(url)
    if asyncio:
        from redis.asyncio.cluster import ClusterNode, RedisCluster
    else:
        from redis.cluster import ClusterNode, RedisCluster
    limit = {} if max_connections is None else {"max_connections": max_connections}
    options = client_options(socket_timeout_s, asyncio=asyncio)
    accepted = inspect.signature(RedisCluster.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):  # an older redis-py's
        options = {k: v for k, v in options.items() if k in accepted}
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in address["nodes"]],
                        username=address["username"], password=address["password"],
                        ssl=address["ssl"], **limit, **options)


def is_cluster_client(client: Any) -> bool:
    """Whether ``client`` is a redis-py ``RedisCluster`` (asyncio or blocking)."""
    import redis.asyncio.cluster
    import redis.cluster
    return isinstance(client, (redis.asyncio.cluster.RedisCluster, redis.cluster.RedisCluster))


def client_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a Redis client that mean "no answer": redis-py's errors (a cluster's
    own ``RedisClusterException`` too, which is not one) and ``OSError``."""
    import redis.exceptions
    return (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


def client_options(socket_timeout_s: float, *, asyncio: bool = True) -> dict[str, Any]:
    """Connection options for a coordinator's client: short socket timeouts and one immediate
    retry on a broken connection only (a pooled connection the server closed by restarting);
    never a retry on a timeout, since the guard answers from local state instead."""
    require("redis", extra="redis", feature="the Redis coordinator (fsm.fleet)")
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    if asyncio:
        from redis.asyncio.retry import Retry
    else:
        from redis.retry import Retry
    return {"socket_timeout": socket_timeout_s, "socket_connect_timeout": socket_timeout_s,
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "decode_responses": False, "driver_info": None}


class RedisCoordinator:
    """The :class:`~fsm.fleet.Coordinator` protocol on a Redis server (redis-py's asyncio
    client), for sessions in several processes and machines.

    ``client`` is a ``redis.asyncio.Redis`` or a ``redis.asyncio.cluster.RedisCluster``
    (SPEC §15.10); build one from a URL with :meth:`from_url`. On a cluster every script
    touches one slot: the keys of one (provider, model, credential) share a hash tag, and a
    batch (:meth:`admit`) holds the calls of one key only, so it goes to one node.
    ``prefix`` separates fleets sharing a server. Every failure to get an answer raises
    :class:`~fsm.fleet.CoordinatorError` (wrap this in :class:`~fsm.fleet.GuardedCoordinator`
    so that sessions never see one). A client belongs to the event loop it first ran in.
    """

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX,
                 bucket_idle_ms: int = DEFAULT_BUCKET_IDLE_MS, url: str | None = None,
                 max_connections: int = 32) -> None:
        if isinstance(bucket_idle_ms, bool) or not isinstance(bucket_idle_ms, int) or bucket_idle_ms < 1:
            raise ValueError(f"bucket_idle_ms must be a positive integer, got {bucket_idle_ms!r}")
        self.client = client
        self.keys = KeySpace(prefix)
        self.bucket_idle_ms = bucket_idle_ms
        self._url = url
        self.cluster = is_cluster_client(client)
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be a positive integer, got {max_connections!r}")
        # At most max_connections commands at once; a call waiting here has sent nothing, so a
        # guard may cancel it, while the tasks in in_flight are mid-command (leave them be).
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self.in_flight: "weakref.WeakSet[asyncio.Task]" = weakref.WeakSet()
        # key -> the bucket's count (milli-tokens) in Redis's last answer: what a guard's local
        # fallback continues from when Redis stops answering.
        self.observed_milli: dict[CoordKey, int] = {}
        self._seen_at: dict[CoordKey, float] = {}  # key -> when this process last saw its bucket (monotonic ms)
        # key -> the end (monotonic ms) of the longest cooldown this process learned or read
        # for it: kept like a bucket it has seen, so an evicted or flushed cooldown key is not
        # forgotten here, and the next admission writes it back (docs/fleet.md "Starting Redis").
        self._cooldown_ends: dict[CoordKey, float] = {}
        self._eviction_check = "todo"  # "todo" | "running" | "done" (see check_eviction)
        self.eviction_warning: str | None = None
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}
        # The calls of one event-loop iteration, per (script, key, shared arguments): sent
        # together, one script call per batch_size() of them, at the end of the iteration.
        self._pending: dict[tuple, tuple[list[str], list, list]] = {}
        self._flush_handle: asyncio.Handle | None = None
        self._batches: set[asyncio.Task] = set()
        # This process in the fleet's heartbeats (processes()): a random id, no host name.
        self.process_id = uuid.uuid4().hex[:16]
        self._probe_lock: asyncio.Lock | None = None  # the probe's own connection, one at a time

    @classmethod
    def from_url(cls, url: str, *, prefix: str = DEFAULT_PREFIX,
                 bucket_idle_ms: int = DEFAULT_BUCKET_IDLE_MS,
                 socket_timeout_s: float = 1.0, max_connections: int = 32) -> "RedisCoordinator":
        """A coordinator on the server at ``url`` (``redis://HOST:PORT/DB``, ``rediss://`` for
        TLS, ``unix:///path.sock``), or on the Redis Cluster at
        ``redis+cluster://HOST:PORT,HOST:PORT`` (:func:`check_url`). Connects lazily; at most
        ``max_connections`` commands (and so connections, per node) at once, more wait their
        turn, so that hundreds of sessions in a process do not open hundreds of connections.
        ``ValueError`` for a bad URL."""
        redis_asyncio = require("redis.asyncio", extra="redis", feature="the Redis coordinator (fsm.fleet)")
        # one connection beyond max_connections is the probe's and the heartbeat's (probe()):
        # a probe never waits behind this process's own load
        if is_cluster_url(url):
            return cls(cluster_client(url, socket_timeout_s, max_connections + 1), prefix=prefix,
                       bucket_idle_ms=bucket_idle_ms, url=url, max_connections=max_connections)
        pool = redis_asyncio.ConnectionPool.from_url(
            check_url(url), max_connections=max_connections + 1, **client_options(socket_timeout_s))
        client = redis_asyncio.Redis.from_pool(pool)
        return cls(client, prefix=prefix, bucket_idle_ms=bucket_idle_ms, url=url,
                   max_connections=max_connections)

    @property
    def url(self) -> str | None:
        """The server's URL as given (it may hold a password: show :func:`redact_url` of it)."""
        return self._url

    def __repr__(self) -> str:
        where = redact_url(self._url) if self._url else "client"
        return f"RedisCoordinator({where!r}, prefix={self.keys.prefix!r})"

    async def _run(self, awaitable: Any, keep: tuple = (), riders: Any = None) -> Any:
        """Await ``awaitable`` (or ``awaitable()``, built once a connection is free) holding one
        of the ``max_connections`` slots; redis-py's errors become
        :class:`~fsm.fleet.CoordinatorError` (a timeout :class:`CoordinatorSlowError`), except
        those in ``keep``. While it is sent, the current task and the tasks ``riders()`` gives
        (the callers of a batch) are in :attr:`in_flight`."""
        import redis.exceptions
        try:
            await self._slots.acquire()
        except BaseException:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never sent: nothing to clean up
            raise
        tasks = [asyncio.current_task()]
        try:
            if riders is not None:
                tasks += riders()
            if callable(awaitable):
                awaitable = awaitable()
            if awaitable is None:
                return None
            for task in tasks:
                if task is not None:
                    self.in_flight.add(task)
            return await awaitable
        except keep:
            raise
        except (redis.exceptions.TimeoutError, TimeoutError) as exc:
            raise CoordinatorSlowError(safe_reason(exc, self._url)) from None
        except client_errors() as exc:
            raise CoordinatorError(safe_reason(exc, self._url)) from None
        finally:
            for task in tasks:
                if task is not None:
                    self.in_flight.discard(task)
            self._slots.release()

    def _ping(self) -> Any:
        """A ``PING`` (on a cluster, of every master: a master that does not answer leaves
        part of the fleet's keys without one)."""
        return self.client.ping(target_nodes="primaries") if self.cluster else self.client.ping()

    async def ping(self) -> None:
        """One round trip (``PING``); raises :class:`~fsm.fleet.CoordinatorError` when none."""
        await self._run(self._ping())

    async def _own(self, awaitable: Any) -> Any:
        """Await ``awaitable`` on the connection kept for probes (one at a time, never
        behind this process's own calls); errors as :meth:`_run`."""
        import redis.exceptions
        if self._probe_lock is None:
            self._probe_lock = asyncio.Lock()
        try:
            async with self._probe_lock:
                return await awaitable
        except (redis.exceptions.TimeoutError, TimeoutError) as exc:
            raise CoordinatorSlowError(safe_reason(exc, self._url)) from None
        except client_errors() as exc:
            raise CoordinatorError(safe_reason(exc, self._url)) from None
        finally:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # not awaited (cancelled while waiting its turn): never sent

    async def probe(self) -> None:
        """Whether the server answers at all, not how loaded this process is: one ``PING`` on
        a connection of its own (not behind this process's queued calls). Raises
        :class:`~fsm.fleet.CoordinatorError` when there is no answer (a guard bounds it)."""
        await self._own(self._ping())

    async def processes(self, ttl_ms: int = PROCESS_TTL_MS) -> int:
        """Say this process is alive (a heartbeat in ``P:processes``, on the server's clock)
        and return how many processes of the fleet were heard within ``ttl_ms``, this one
        included (at least 1): what a guard divides the budget by for its local share."""
        reply = await self._own(self._scripts["processes"](
            keys=[self.keys.processes()], args=[MAX_LEFT_MS, "", self.process_id, int(ttl_ms)]))
        return max(1, int(reply)) if isinstance(reply, int) and not isinstance(reply, bool) else 1

    # -- the calls of one loop iteration, in one script call per key ----------------------
    def _enqueue(self, name: str, keys: list[str], common: list, item: list,
                 tag: Any) -> "asyncio.Future[list]":
        """Queue one request for script ``name`` (its ``item`` arguments after ``common``):
        a future of its reply block. The requests queued in one loop iteration with the same
        script, keys and ``common`` go in one call (:meth:`_flush`); ``tag`` is kept with
        the request for the reply's handling."""
        loop = asyncio.get_running_loop()
        group = (name, tuple(keys), tuple(common))
        pending = self._pending.get(group)
        if pending is None:
            pending = self._pending[group] = (keys, common, [])
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        future = loop.create_future()
        pending[2].append((future, asyncio.current_task(), item, tag))
        return future

    def _flush(self) -> None:
        self._flush_handle = None
        pending, self._pending = self._pending, {}
        loop = asyncio.get_running_loop()
        size = batch_size(sum(len(items) for _, _, items in pending.values()), self.max_connections)
        for (name, _, _), (keys, common, items) in pending.items():
            for start in range(0, len(items), size):
                task = loop.create_task(self._send(name, keys, common, items[start:start + size]))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _send(self, name: str, keys: list[str], common: list, items: list) -> None:
        """One script call for ``items``; each caller's future gets its block of the reply
        (or the error). A caller that stopped waiting before the call was sent is left out;
        one that stopped after has its answer handled by :meth:`_orphan`."""
        import redis.exceptions
        width = 7 if name == "admit" else 1
        sent: list = []
        if self._eviction_check == "todo":
            await self.check_eviction()

        def make() -> Any:
            sent.extend(it for it in items if not it[0].done())
            if not sent:
                return None
            args = [*common, len(sent)]
            for it in sent:
                args.extend(it[2])
            return self._scripts[name](keys=keys, args=args)

        try:
            reply = await self._run(make, keep=(redis.exceptions.ResponseError,),
                                    riders=lambda: [it[1] for it in items if not it[0].done()])
            if not sent:
                return
            if (not isinstance(reply, list) or len(reply) != width * len(sent)
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in reply)):
                raise CoordinatorKeyError(f"unexpected reply {str(reply)[:80]!r}")
        except BaseException as exc:
            if isinstance(exc, redis.exceptions.ResponseError):
                text = str(exc)
                keyed = text.startswith("WRONGTYPE") or "script" in text.lower()
                exc = (CoordinatorKeyError if keyed else CoordinatorError)(safe_reason(exc, self._url))
            elif not isinstance(exc, Exception):
                exc = CoordinatorError("the coordinator's batch was cancelled")
            for it in sent or items:
                if not it[0].done():
                    it[0].set_exception(exc)
                    it[0].exception()  # retrieved here too: a caller that is gone logs nothing
            return
        for n, it in enumerate(sent):
            block = reply[n * width:(n + 1) * width]
            if it[0].done():
                self._orphan(name, block, it[3])
            else:
                it[0].set_result(block)

    def _orphan(self, name: str, block: list, tag: Any) -> None:
        """The answer of a call whose caller stopped waiting after it was sent: a budget token
        it took goes back (its retry will not be sent)."""
        if name == "admit" and tag is not None and block[2] == 1:
            key, budget = tag
            task = asyncio.get_running_loop().create_task(self._credit(key, budget, MILLI, "", None))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def warm_up(self, connections: int | None = None) -> None:
        """Open ``connections`` pooled connections (default: ``max_connections``) and load the
        scripts into the server, so
        that the first burst of decisions does not pay for connecting and ``NOSCRIPT``
        round trips (call it when the host starts). Raises
        :class:`~fsm.fleet.CoordinatorError` when the server does not answer."""
        count = self.max_connections if connections is None else max(1, connections)
        await asyncio.gather(*(self._run(self._ping()) for _ in range(count)))
        for script in self._scripts.values():
            await self._run(self.client.script_load(script.script))
        await self.check_eviction()

    # -- what is sent and what comes back -----------------------------------------------
    def _seen(self, key: CoordKey) -> str:
        """'1' when this process used ``key``'s bucket within ``bucket_idle_ms`` (so its
        disappearance means it was lost, not idle: it counts as spent)."""
        seen = self._seen_at.get(key)
        return "1" if seen is not None and time.monotonic() * 1000 - seen < self.bucket_idle_ms else "0"

    def _observe(self, key: CoordKey, milli: int) -> None:
        """Keep the last count Redis gave for ``key`` (see :attr:`observed_milli`)."""
        if len(self.observed_milli) > 1024:
            self.observed_milli.clear()
            self._seen_at.clear()
        self.observed_milli[key] = int(milli)
        self._seen_at[key] = time.monotonic() * 1000

    def _remember_cooldown(self, key: CoordKey, left_ms: Any, asked_ms: float) -> None:
        """Keep ``key``'s cooldown, ``left_ms`` from ``asked_ms`` (monotonic ms: the time the
        question was sent, so the end kept is never later than the server's)."""
        if not isinstance(left_ms, int) or isinstance(left_ms, bool) or not 0 < left_ms <= MAX_LEFT_MS:
            return
        end = asked_ms + left_ms
        if end > self._cooldown_ends.get(key, -math.inf):
            if len(self._cooldown_ends) >= _MAX_KEPT_COOLDOWNS and key not in self._cooldown_ends:
                now = time.monotonic() * 1000
                self._cooldown_ends = {k: e for k, e in self._cooldown_ends.items() if e > now}
                if len(self._cooldown_ends) >= _MAX_KEPT_COOLDOWNS:  # all alive: drop the soonest
                    del self._cooldown_ends[min(self._cooldown_ends, key=self._cooldown_ends.__getitem__)]
            self._cooldown_ends[key] = end

    def _known_cooldown(self, key: CoordKey) -> int:
        """The ms left of the cooldown this process keeps for ``key`` (0: none)."""
        end = self._cooldown_ends.get(key)
        if end is None:
            return 0
        left = math.ceil(end - time.monotonic() * 1000)
        if left <= 0:
            del self._cooldown_ends[key]
            return 0
        return min(left, MAX_LEFT_MS)

    def _budget_args(self, key: CoordKey, budget: BudgetSettings | None) -> list:
        if budget is None:
            return ["", "0", self.bucket_idle_ms, BUCKET_TTL_MS]
        return [max_milli(budget), self._seen(key), self.bucket_idle_ms, BUCKET_TTL_MS]

    @staticmethod
    def _pacing_args(pacing: PacingSettings | None) -> list[str]:
        """The scripts' ten pacing arguments (``_LUA_PACER``); all ``''`` when pacing is off.
        Floats are sent as ``repr`` (read back exactly), the growth shares as their ``log1p``
        (which Lua 5.1 lacks), so that the script's doubles are :mod:`fsm.core.pacing`'s."""
        if pacing is None or not pacing.enabled:
            return [""] * 10
        return [repr(float(pacing.min_rate)),
                "" if pacing.max_rate is None else repr(float(pacing.max_rate)),
                repr(float(pacing.beta)), repr(math.log1p(pacing.growth_per_s)),
                repr(math.log1p(pacing.fast_growth_per_s)), str(pacing.cut_interval_ms),
                str(pacing.horizon_ms), str(pacing.forget_after_ms), repr(float(pacing.memory_s)),
                str(pacer_ttl_ms(pacing))]

    async def check_eviction(self) -> str | None:
        """Whether this Redis may evict the fleet's keys; once per coordinator, at its first
        script (and in :meth:`warm_up`). Every key of the fleet has an expiry, so with a
        ``maxmemory`` limit any ``maxmemory-policy`` but ``noeviction`` (``allkeys-*`` and
        ``volatile-*`` alike) can drop a cooldown, a bucket or a pacer under memory pressure:
        then the text of a warning (logged on ``fsm.fleet``) is returned. A server that refuses
        ``CONFIG GET`` (a managed Redis, an ACL) gets a warning that it could not be checked.
        None: nothing to say (``noeviction``, or no ``maxmemory``), or no answer (asked again
        at the next script). Raises nothing but a cancellation; docs/fleet.md "Starting Redis"."""
        if self._eviction_check != "todo":
            return self.eviction_warning
        self._eviction_check = "running"
        import redis.exceptions
        where = redact_url(self._url) if self._url else "this Redis"
        refused = None
        try:
            if self.cluster:  # every master's: {node name: its settings}
                config = await self._run(self.client.config_get("maxmemory*", target_nodes="primaries"),
                                         keep=(redis.exceptions.ResponseError,))
            else:
                config = {where: await self._run(self.client.config_get("maxmemory*"),
                                                 keep=(redis.exceptions.ResponseError,))}
        except CoordinatorError:
            self._eviction_check = "todo"  # no answer: asked again at the next script
            return None
        except Exception as exc:  # NOPERM, an unknown or renamed command, a client without it
            refused = safe_reason(exc)
        except BaseException:
            self._eviction_check = "todo"  # cancelled mid-question
            raise
        if refused is not None:
            self.eviction_warning = (
                f"could not check whether {where} may evict the fleet's keys (CONFIG GET refused: "
                f"{refused}); the fleet needs maxmemory-policy noeviction or no maxmemory "
                "(docs/fleet.md \"Starting Redis\")")
        else:
            warnings = [_eviction_warning(settings, where if name == where else f"{where} (node {name})")
                        for name, settings in dict(config or {}).items()]
            self.eviction_warning = "; ".join(w for w in warnings if w) or None
        self._eviction_check = "done"
        if self.eviction_warning:
            log.warning("%s", self.eviction_warning)
        return self.eviction_warning

    async def _script(self, name: str, keys: list[str], args: list, now: float | None = None) -> Any:
        """Run script ``name``; a script error on one key's data is a
        :class:`CoordinatorKeyError` (the server answered)."""
        import redis.exceptions
        if self._eviction_check == "todo":
            await self.check_eviction()
        try:
            return await self._run(self._scripts[name](
                keys=keys, args=[MAX_LEFT_MS, "" if now is None else repr(float(now)), *args]),
                keep=(redis.exceptions.ResponseError,))
        except redis.exceptions.ResponseError as exc:
            text = str(exc)
            if text.startswith("WRONGTYPE") or "script" in text.lower():
                raise CoordinatorKeyError(safe_reason(exc, self._url)) from None
            raise CoordinatorError(safe_reason(exc, self._url)) from None  # OOM, READONLY, BUSY: the server's

    @staticmethod
    def _ints(reply: Any, count: int) -> list[int]:
        """``reply`` as ``count`` ints, or :class:`CoordinatorKeyError`."""
        if (not isinstance(reply, list) or len(reply) != count
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in reply)):
            raise CoordinatorKeyError(f"unexpected reply {str(reply)[:80]!r}")
        return reply

    # -- protocol v3 ----------------------------------------------------------------------
    async def admit(self, key: CoordKey, *, retry: bool, budget: BudgetSettings | None,
                    pacing: PacingSettings | None, earliest_ms: int = 0,
                    floor_slot_due: bool = False, max_wait_ms: int | None = None,
                    _now: float | None = None) -> Admission:
        """Protocol v3's ``admit``. The calls of one event-loop iteration for one key (and the
        same settings) go to Redis together, in one call of the ADMIT script, which admits
        them in order as separate steps would (:data:`BATCH_MAX` per call, more when the
        calls would otherwise outnumber the connections: :func:`batch_size`): ten thousand
        callers cost Redis a few dozen round trips, not ten thousand. A caller that
        stops waiting (cancelled) before its batch is sent is left out; after, a token its
        answer took is given back."""
        interval = floor_interval_ms(budget) if budget is not None else math.inf
        common = [MAX_LEFT_MS, "" if _now is None else repr(float(_now)),
                  *self._budget_args(key, budget), budget.mode if budget is not None else "refuse",
                  "" if math.isinf(interval) else repr(interval),
                  *self._pacing_args(pacing), WAIT_RECHECK_MS, FLOOR_HORIZON_MS]
        item = ["1" if retry and budget is not None else "0",
                check_duration("earliest_ms", earliest_ms), "1" if floor_slot_due else "0",
                "" if max_wait_ms is None else check_duration("max_wait_ms", max_wait_ms),
                self._known_cooldown(key)]
        asked = time.monotonic() * 1000
        # The reply (ADMIT), seven ints: cooldown_ms, allowed (1/0/-1 no budget), token_taken,
        # pacing_ms (-1: no slot within the pacer's horizon -> pacing_booked=False, nothing
        # taken), budget_wait_ms, the bucket's milli-tokens (-1: not read), budget_slot_booked
        # (0: wait mode reserved no floor slot -> budget_slot_booked=False; 1 otherwise).
        keys = [self.keys.cooldown(key), self.keys.bucket(key), self.keys.floor(key),
                self.keys.pacer(key)]
        reply = await self._enqueue("admit", keys, common, item,
                                    (key, budget) if retry and budget is not None else None)
        cooldown, allowed, taken, pacing_ms, wait, milli, booked = reply
        self._remember_cooldown(key, cooldown, asked)
        if milli >= 0:
            self._observe(key, milli)
        if pacing_ms == -1:  # the pacer had no slot within its horizon: nothing taken
            return Admission(cooldown_ms=clamp_left(cooldown), pacing_booked=False)
        return Admission(cooldown_ms=clamp_left(cooldown),
                         budget=None if allowed < 0 else bool(allowed),
                         token_taken=bool(taken), pacing_ms=clamp_left(pacing_ms),
                         budget_wait_ms=clamp_left(wait), budget_slot_booked=booked != 0)

    async def _credit(self, key: CoordKey, budget: BudgetSettings | None, add_milli: int,
                      outcome: str, pacing: PacingSettings | None,
                      _now: float | None = None) -> int:
        """The CREDIT script: ``add_milli`` to the bucket (with ``budget``), and ``outcome``
        (``'t'`` throttled, ``'s'`` a success, ``'o'`` any other answer, ``''`` none) to the
        pacer (with ``pacing``)."""
        common = [MAX_LEFT_MS, "" if _now is None else repr(float(_now)),
                  *self._budget_args(key, budget), *self._pacing_args(pacing)]
        (reply,) = await self._enqueue("credit", [self.keys.bucket(key), self.keys.pacer(key)],
                                       common, [int(add_milli), outcome], None)
        if reply >= 0 and budget is not None:
            self._observe(key, min(reply, max_milli(budget)))
        return reply

    async def record_outcome(self, key: CoordKey, *, success: bool, throttled: bool,
                             budget: BudgetSettings | None, pacing: PacingSettings | None,
                             _now: float | None = None) -> None:
        if (budget is None or not success) and (pacing is None or not pacing.enabled):
            return
        outcome = "t" if throttled else "s" if success else "o"
        await self._credit(key, budget if success else None,
                           ratio_milli(budget) if success and budget is not None else 0,
                           outcome, pacing, _now)

    async def return_retry_token(self, key: CoordKey, budget: BudgetSettings) -> None:
        await self._credit(key, budget, MILLI, "", None)

    async def learn_cooldown(self, key: CoordKey, duration_ms: int,
                             now_ms: int | None = None) -> None:
        if now_ms is not None:  # before v3: (key, until_ms, now_ms)
            duration_ms = check_ms("until_ms", duration_ms) - check_ms("now_ms", now_ms)
        asked = time.monotonic() * 1000
        left = await self._script("learn", [self.keys.cooldown(key)],
                                  [check_duration("duration_ms", duration_ms)])
        if isinstance(left, int) and not isinstance(left, bool):
            self._remember_cooldown(key, left, asked)

    async def cooldown_left(self, key: CoordKey) -> int:
        """Time left of ``key``'s cooldown (validated; 0 = none), or of the cooldown this
        process learned or read for it, whichever is longer (a key evicted or flushed does not
        make this process forget a cooldown)."""
        known = self._known_cooldown(key)
        return max(clamp_left(await self._script("left", [self.keys.cooldown(key)], [])), known)

    async def mark_fallback(self, key: CoordKey, duration_ms: int) -> None:
        await self._script("learn", [self.keys.fallback(key)],
                           [check_duration("duration_ms", duration_ms)])

    async def fallback_left_ms(self, key: CoordKey) -> int:
        return clamp_left(await self._script("left", [self.keys.fallback(key)], []))

    async def mark_credential_limited(self, provider: str, credential: str, duration_ms: int,
                                      now_ms: int | None = None) -> None:
        if now_ms is not None:  # before v3: (provider, credential, until_ms, now_ms)
            duration_ms = check_ms("until_ms", duration_ms) - check_ms("now_ms", now_ms)
        await self._script("mark", [self.keys.limited(provider)],
                           [credential, check_duration("duration_ms", duration_ms)])

    async def limited_credentials(self, provider: str, now_ms: int | None = None) -> dict[str, int]:
        if self.cluster:  # a cluster's pipeline cannot send TIME: the same read as a script
            left = limited_from_replies(limited_script_replies(
                await self._script("limited", [self.keys.limited(provider)], [])))
        else:
            pipe = self.client.pipeline(transaction=False)
            queue_limited_read(pipe, self.keys.limited(provider))
            left = limited_from_replies(await self._run(pipe.execute(raise_on_error=False)))
        if now_ms is not None:  # before v3: id -> end in the caller's clock
            return {c: now_ms + ms for c, ms in left.items()}
        return left

    async def tokens(self, key: CoordKey, budget: BudgetSettings) -> float:
        """The bucket's count now, in tokens, as the next step would see it (for tests and
        diagnostics; takes nothing)."""
        reply = await self._credit(key, budget, 0, "", None)
        return min(int(reply), max_milli(budget)) / MILLI

    # -- before v3 (thin wrappers while the session and runner call them) ------------------
    async def cooldown_left_ms(self, key: CoordKey, now_ms: int) -> int:
        return await self.cooldown_left(key)

    async def take_retry_token(self, key: CoordKey, budget: BudgetSettings) -> bool:
        return bool((await self.admit(key, retry=True, budget=budget, pacing=None)).budget)

    async def before_decision(self, key: CoordKey, now_ms: int,
                              budget: BudgetSettings | None) -> tuple[int, bool | None]:
        check_ms("now_ms", now_ms)
        answer = await self.admit(key, retry=True, budget=budget, pacing=None)
        return answer.cooldown_ms, answer.budget

    async def credit_success(self, key: CoordKey, budget: BudgetSettings) -> None:
        await self.record_outcome(key, success=True, throttled=False, budget=budget, pacing=None)

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # closing a dead connection must not fail the caller's shutdown
            pass


def _eviction_warning(config: Any, where: str) -> str | None:
    """The warning for a ``CONFIG GET maxmemory*`` reply (a dict, bytes or str), or None when
    no key of the fleet can be evicted (``noeviction``, or ``maxmemory`` 0: no limit)."""
    def text(value: Any) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    values = {text(k): text(v) for k, v in dict(config or {}).items()}
    policy, limit = values.get("maxmemory-policy", ""), values.get("maxmemory", "")
    if policy == "noeviction" or limit == "0":
        return None
    if not policy or not limit:
        return (f"could not check whether {where} may evict the fleet's keys (CONFIG GET "
                f"maxmemory* answered {sorted(values)!r}); the fleet needs maxmemory-policy "
                "noeviction or no maxmemory (docs/fleet.md \"Starting Redis\")")
    return (f"{where} may evict the fleet's keys (maxmemory {limit} bytes, maxmemory-policy "
            f"{policy}; every key of the fleet has an expiry, so volatile-* policies evict them "
            "too): a process keeps the cooldowns and buckets it has seen, but a process that "
            "has not may miss a cooldown; set maxmemory-policy noeviction or maxmemory 0 "
            "(docs/fleet.md \"Starting Redis\")")


def queue_limited_read(pipe: Any, name: str) -> None:
    """Queue the one round trip that reads a provider's credential marks: the server's
    ``TIME``, the key's ``TYPE`` and its members with their ends (no script, so a process's
    first read needs no script load)."""
    pipe.time()
    pipe.type(name)
    pipe.zrange(name, 0, -1, withscores=True)


def limited_script_replies(reply: Any) -> Any:
    """The LIMITED_READ script's reply in the shape of :func:`queue_limited_read`'s replies
    (``[(seconds, microseconds), type, [(member, score), ...]]``); a reply of another shape
    gives one that :func:`limited_from_replies` reads as no marks."""
    try:
        sec, usec, kind, flat = reply
        rows = []
        for i in range(0, len(flat) - 1, 2):
            try:
                rows.append((flat[i], float(flat[i + 1])))
            except (TypeError, ValueError):
                continue
        return [(sec, usec), kind, rows]
    except (TypeError, ValueError):
        return None


def limited_from_replies(replies: Any) -> dict[str, int]:
    """Credential id -> ms left from :func:`queue_limited_read`'s replies (server's clock).
    A key of the wrong type, a member that is not UTF-8, a score that is not a number or
    lies beyond :data:`~fsm.fleet.MAX_LEFT_MS` is skipped (that mark degrades, never the
    read)."""
    out: dict[str, int] = {}
    try:
        (sec, usec), kind, rows = replies
        now = int(sec) * 1000 + int(usec) // 1000
    except (TypeError, ValueError):
        return out
    if kind not in (b"zset", "zset") or not isinstance(rows, list):
        return out
    for row in rows:
        try:
            member, score = row
        except (TypeError, ValueError):
            continue
        if isinstance(member, bytes):
            try:
                member = member.decode("utf-8")
            except UnicodeDecodeError:
                continue
        if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
            left = clamp_left(score - now)
            if isinstance(member, str) and left > 0:
                out[member] = max(left, out.get(member, 0))
    return out
