-- quota.lua: a calendar quota, a counter per period (day, week, month or billing month).
--
-- KEYS: one integer string per check, the units counted in the period. The key's name
--   carries the period's start (applimit/_calls.py), so each period counts on a key of its
--   own, which expires GRACE_MS after the period's end: one counter per period, whatever
--   the traffic.
-- ARGV: none of its own. The spec (see decide.lua) carries absolute times where a rate's
--   carries lengths: "quota <limit> <end µs> <cost> <start µs> <shadow>", so c.period is
--   the period's end and c.burst its start, both in µs since the epoch. The periods follow
--   a time zone's calendar, which the script cannot read: applimit computes them.
-- Functions (registered as ALG.quota):
--   check(key, now, c, slack_ms, st) fills st (every field); reads only
--   apply(key, st, now, c, nonce, slack_ms)  INCRBY the cost; a new counter gets its TTL
--   refund(key, now, c, nonce)       DECRBY the cost; an emptied counter is deleted
-- Returns (in st): allowed (0/1), remaining (units left in the period), reset (µs until
--   the period ends, never more than its length), retry (NONE when allowed, NEVER when
--   the cost exceeds the limit, else the reset: a refused request fits in the next period).

-- A request the app's clock places just before the period's end may reach Redis just
-- after it: the counter outlives the period by this much, so it still finds the count.
local GRACE_MS = 60000

local function quota_check(key, now, c, slack_ms, st)
  local value = CALL('GET', key)
  local used = value and (value + 0) or 0
  local left = c.limit - used
  local reset = c.period - m_max(now, c.burst)
  if reset < 0 then
    reset = 0
  end
  st.used = used
  st.allowed, st.retry, st.consumed, st.reset = 0, NONE, 0, reset
  st.remaining = m_max(left, 0)
  if c.cost <= left then
    st.allowed = 1
  elseif c.cost > c.limit then
    st.retry = NEVER
  else
    st.retry = reset
  end
end

local function quota_apply(key, st, now, c, nonce, slack_ms)
  local count = CALL('INCRBY', key, c.cost_text)
  if st.used == 0 then
    -- A new counter: it lives until the period's end and the grace (a TTL in the past,
    -- possible only under a test clock far behind the server's, deletes it, as PEXPIRE does).
    CALL('PEXPIRE', key, fmt(cdiv(c.period - now, 1000) + slack_ms + GRACE_MS))
  end
  st.remaining = m_max(c.limit - count, 0)
end

local function quota_refund(key, now, c, nonce)
  if CALL('EXISTS', key) == 0 then
    return
  end
  if CALL('DECRBY', key, c.cost_text) <= 0 then
    CALL('DEL', key)
  end
end

ALG.quota = {check = quota_check, apply = quota_apply, refund = quota_refund}
