-- lease.lua: a concurrency limit, at most `limit` requests of one caller at once.
--
-- KEYS: one sorted set per check. Each admitted request holds one lease: a member named
--   after its call's nonce, scored with the time the lease runs out (admission + period
--   µs; the period is the policy's `lease`). The request gives it back when it ends (a
--   refund with the same nonce); a lease whose process died runs out at its score, and
--   from then on no longer counts.
-- ARGV: none of its own; decide.lua passes c = {limit, period (µs), cost, burst, flags}.
--   A request holds one lease whatever its cost: cost is not read.
-- Functions (registered as ALG.lease):
--   check(key, now, c, slack_ms, st) fills st (every field); reads only
--   apply(key, st, now, c, nonce, slack_ms)  drops the leases that ran out, adds this
--                                    request's; the TTL ends the expiry cell (common.lua)
--                                    of the newest lease's end
--   refund(key, now, c, nonce)       gives the request's lease back
-- Returns (in st): allowed (0/1), remaining (leases free), reset (0: when a lease comes
--   back is the requests' to know), retry (NONE when allowed, else LEASE_RETRY).

-- The retry of a refused request, in µs: a lease comes back when a request ends, which
-- nothing here can know; clients are told to try again in a second.
local LEASE_RETRY = 1000000

local function lease_check(key, now, c, slack_ms, st)
  local held = CALL('ZCOUNT', key, '(' .. fmt(now), '+inf')
  st.remaining = m_max(0, c.limit - held)
  st.reset = 0
  if held < c.limit then
    st.allowed = 1
    st.retry = NONE
  else
    st.allowed = 0
    st.retry = LEASE_RETRY
  end
end

local function lease_apply(key, st, now, c, nonce, slack_ms)
  CALL('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  local ends = now + c.period
  CALL('ZADD', key, fmt(ends), nonce)
  local cell = expiry_cell(ends, c.period)
  CALL('PEXPIRE', key, fmt(cell_ttl_ms(cell, c.period, now, slack_ms)))
  st.remaining = st.remaining - 1
end

local function lease_refund(key, now, c, nonce)
  CALL('ZREM', key, nonce)
end

ALG.lease = {check = lease_check, apply = lease_apply, refund = lease_refund}
