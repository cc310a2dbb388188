-- gcra.lua: the generic cell rate algorithm, a token bucket kept as one timestamp.
--
-- KEYS: one string per check, "<tat> <frac>": the theoretical arrival time TAT is
--   tat + frac / limit microseconds, kept as an integer and a remainder so that an
--   emission interval of period / limit is exact even when it is not a whole µs. frac is
--   written with a leading 0 ("0" .. frac) when the key's TTL ends an expiry cell
--   (common.lua); applimit 0.1 wrote it without, with a TTL ending exactly at the TAT.
--   Both read as the same number, so either version reads the other's values.
-- ARGV: none of its own; decide.lua passes c = {limit, period (µs), cost, burst, shadow}.
--   burst is how many requests may arrive at once (the bucket's size).
-- Functions (registered as ALG.gcra):
--   check(key, now, c, slack_ms, st) fills st (every field); reads only
--   apply(key, st, now, c, nonce, slack_ms)  stores the new TAT; the TTL ends the TAT's
--                                    expiry cell (common.lua), set only when that changes
--   refund(key, now, c, nonce)       moves the TAT back by what an earlier apply added
-- Returns (in st): allowed (0/1), remaining (requests admitted now, one by one), reset
--   (µs until the bucket is full again), retry (µs until `cost` fits; NONE when allowed,
--   NEVER when cost > burst).
--
-- In units of µs x limit the emission interval is `period` and the bucket holds
-- burst x period, so every comparison below is between exact integers.

-- Whether a stored frac says that the key's TTL ends an expiry cell (a leading 0).
local function on_grid(frac)
  return #frac > 1 and s_byte(frac, 1) == 48
end

-- How far ahead of `now` the TAT is (in µs x limit, at least 0), and the stored TAT's
-- whole µs when the key's TTL ends that TAT's expiry cell (nil without a key, or when
-- the TTL was set otherwise).
local function gcra_load(key, now, c)
  local value = CALL('GET', key)
  if not value then
    return 0, nil
  end
  local tat, frac = s_match(value, '^(%-?%d+) (%d+)$')
  tat = tat + 0
  local ahead = (tat - now) * c.limit + frac
  if not on_grid(frac) then
    tat = nil
  end
  if ahead < 0 then
    return 0, tat
  end
  return ahead, tat
end

local function gcra_check(key, now, c, slack_ms, st)
  local ahead, tat = gcra_load(key, now, c)
  local capacity = c.burst * c.period
  local after = ahead + c.cost * c.period
  -- Every field set afresh (st is reused, see decide.lua); tat is false without a key.
  st.ahead, st.after, st.tat = ahead, after, tat or false
  st.allowed, st.retry, st.remaining, st.reset, st.consumed = 0, NONE, 0, 0, 0
  if after <= capacity then
    st.allowed = 1
  elseif c.cost > c.burst then
    st.retry = NEVER
  else
    st.retry = cdiv(after - capacity, c.limit)
  end
  st.remaining = idiv(capacity - ahead, c.period)
  st.reset = cdiv(ahead, c.limit)
end

local function gcra_apply(key, st, now, c, nonce, slack_ms)
  local whole = idiv(st.after, c.limit)
  local frac = st.after - whole * c.limit
  local tat = now + whole
  local value = s_format('%d 0%d', tat, frac)
  -- The key must live until the TAT (rounded up to a whole µs): until the end of its
  -- expiry cell. If the stored TAT's cell is the same (and its TTL was set for it), the
  -- TTL set then still holds.
  local cell = expiry_cell(tat + 1, c.period)
  if st.tat and expiry_cell(st.tat + 1, c.period) == cell then
    CALL('SET', key, value, 'KEEPTTL')
  else
    CALL('SET', key, value, 'PX', fmt(cell_ttl_ms(cell, c.period, now, slack_ms)))
  end
  st.remaining = idiv(c.burst * c.period - st.after, c.period)
  st.reset = cdiv(st.after, c.limit)
end

local function gcra_refund(key, now, c, nonce)
  -- `now` is the time of the hit being undone: the TAT never moves back before it.
  local value = CALL('GET', key)
  if not value then
    return
  end
  local tat, frac = s_match(value, '^(%-?%d+) (%d+)$')
  local ahead = (num(tat) - now) * c.limit + num(frac) - c.cost * c.period
  if ahead <= 0 then
    CALL('DEL', key)
    return
  end
  local whole = idiv(ahead, c.limit)
  -- The TAT moves back and the TTL stays: what it was set for still covers it.
  local mark = on_grid(frac) and ' 0' or ' '
  CALL('SET', key, fmt(now + whole) .. mark .. fmt(ahead - whole * c.limit), 'KEEPTTL')
end

ALG.gcra = {check = gcra_check, apply = gcra_apply, refund = gcra_refund}
