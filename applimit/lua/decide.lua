-- decide.lua: one decision over any number of limit checks, atomically, in one round trip.
-- It is the last part of the script, after common.lua and the algorithm files.
--
-- KEYS[i]  the state key of check i. On Redis Cluster every key of one call carries the
--          same hash tag (the identity), so they share a slot.
-- ARGV[1]  mode: "hit"    consume when every enforced check passes;
--                "peek"   read only;
--                "refund" undo an earlier hit that used the same nonce and time
-- ARGV[2]  the time in µs, or "" to read the server's TIME (production always does; tests
--          and refunds pass it)
-- ARGV[3]  a nonce unique to the call: sliding-log entries are named after it
-- ARGV[4]  ms added to every expiry: 0, except under a test clock, whose time does not
--          run with the server's
-- ARGV[5]  n, the number of checks; then check i's spec, ARGV[5 + i]: one string
--          "<algorithm> <limit> <period µs> <cost> <burst> <flags>", burst 0 but for
--          gcra; flags 0 to 3: 1 shadow, 2 after (a count_when limit checked before its
--          response: a hit never writes it; the count comes from a later call without the
--          flag), 3 both (common.lua's spec_of parses it, once per library load)
-- Returns  {now, n, then for each check: allowed, consumed, remaining, reset µs, retry µs}
--          for "hit" and "peek"; {now, n} for "refund". retry is -1 when allowed and -2
--          when the cost can never fit.
--          A malformed spec, or an unknown algorithm, is an error reply.
--
-- Phase 1 evaluates every check without writing (the sliding log may rewrite members an
-- older version wrote, which changes no count). Phase 2 (hit only) writes when every
-- enforced check passed: the enforced checks, and each shadow check that passed itself.
-- A shadow check never blocks the others: it counts the traffic that gets through, the
-- way it would count if it were enforced.
--
-- Each algorithm's first write adds memory (ZADD, HSET, SET). A server out of memory
-- (maxmemory, noeviction) refuses a Function call as a whole, but an EVAL script only at
-- its first such write, and only if the script has written nothing before: a trim or a
-- PEXPIRE first would let the rest through. So a full server refuses every decision that
-- would write, and still answers those that write nothing.

-- Bound once per library load (see common.lua); every call in an EVAL script.
if not CALL then
  bind_globals()
end
local mode = ARGV[1]
local now
NOW_TEXT = false
if ARGV[2] ~= '' then
  now = num(ARGV[2])
  NOW_SEC, NOW_USEC = false, false
else
  local t = CALL('TIME')
  NOW_SEC, NOW_USEC = t[1], t[2]
  now = NOW_SEC * 1000000 + NOW_USEC
end
local nonce = ARGV[3]
local slack_ms = ARGV[4] + 0
local n = ARGV[5] + 0

-- CHECKS and STATES are reused (see common.lua): only their first n entries are this
-- call's.
local checks = CHECKS
for i = 1, n do
  local c = spec_of(ARGV[5 + i])
  if not c.alg then
    return redis.error_reply(c.error)
  end
  checks[i] = c
end

if mode == 'refund' then
  for i = 1, n do
    checks[i].alg.refund(KEYS[i], now, checks[i], nonce)
  end
  return {now, n}
end

local states = STATES
local pass = true
for i = 1, n do
  local st = states[i]
  if not st then
    st = {}
    states[i] = st
  end
  local c = checks[i]
  c.alg.check(KEYS[i], now, c, slack_ms, st)
  st.consumed = 0
  if st.allowed == 0 and not c.shadow then
    pass = false
  end
end

if mode == 'hit' and pass then
  for i = 1, n do
    local st = states[i]
    if st.allowed == 1 and not checks[i].after then
      checks[i].alg.apply(KEYS[i], st, now, checks[i], nonce, slack_ms)
      st.consumed = 1
    end
  end
end

if n == 1 then
  -- One check (most decisions): the reply in one constructor, sized once.
  local st = states[1]
  return {now, 1, st.allowed, st.consumed, st.remaining, st.reset, st.retry}
end
local out = OUTS[n]
if not out then
  out = {}
  OUTS[n] = out
end
out[1], out[2] = now, n
local at = 2
for i = 1, n do
  local st = states[i]
  out[at + 1] = st.allowed
  out[at + 2] = st.consumed
  out[at + 3] = st.remaining
  out[at + 4] = st.reset
  out[at + 5] = st.retry
  at = at + 5
end
return out
