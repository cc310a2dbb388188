-- sliding_window.lua: the two-counter approximation of a sliding window (constant memory).
--
-- KEYS: one hash per check with fields w (the index of the current fixed window,
--   floor(time / period)), c (its count) and p (the count of window w - 1).
-- ARGV: none of its own; decide.lua passes c = {limit, period (µs), cost, burst (unused),
--   shadow}.
-- Functions (registered as ALG.sliding_window):
--   check(key, now, c, slack_ms, st) fills st (every field); reads only
--   apply(key, st, now, c, nonce, slack_ms)  adds cost to the current window; PEXPIRE on
--                                    the first write of each window
--   refund(key, now, c, nonce)       subtracts what an earlier apply added
-- Returns (in st): allowed (0/1), remaining, reset (µs until the estimate is back to 0),
--   retry (µs until `cost` fits if nothing else arrives; NONE when allowed, NEVER when
--   cost > limit).
--
-- The estimate of the last period is p x (period - elapsed) / period + c: it assumes the
-- previous window's requests were spread evenly. Everything is compared multiplied by
-- period, so the arithmetic stays in integers. docs/applimit.md states the error bound.

local function sw_check(key, now, c, slack_ms, st)
  local period = c.period
  local window = idiv(now, period)
  local fields = CALL('HMGET', key, 'w', 'c', 'p')
  local stored = num(fields[1])
  local cur, prev = 0, 0
  if stored == nil then
    cur, prev = 0, 0
  elseif stored == window then
    cur, prev = num(fields[2]) or 0, num(fields[3]) or 0
  elseif stored == window - 1 then
    cur, prev = 0, num(fields[2]) or 0
  elseif stored > window then
    -- The clock went back across a window edge: keep counting in the stored window, with
    -- the previous window at full weight (the conservative reading).
    window = stored
    cur, prev = num(fields[2]) or 0, num(fields[3]) or 0
  end
  local elapsed = m_max(0, now - window * period)
  local used = prev * (period - elapsed) + cur * period
  local full = c.limit * period
  -- Every field set afresh (st is reused, see decide.lua); stored is false without a key.
  st.window, st.stored, st.cur, st.prev, st.elapsed = window, stored or false, cur, prev, elapsed
  st.allowed, st.retry, st.remaining, st.reset, st.consumed = 0, NONE, 0, 0, 0
  if used + c.cost * period <= full then
    st.allowed = 1
  elseif c.cost > c.limit then
    st.retry = NEVER
  else
    local room = c.limit - cur - c.cost
    if room >= 0 and prev > 0 then
      -- Fits later in this window, once the previous window's weight has shrunk enough.
      st.retry = period - idiv(room * period, prev) - elapsed
    else
      -- Fits only in the next window, where this window's count becomes the weighted one.
      local at = m_max(0, period - idiv((c.limit - c.cost) * period, cur))
      st.retry = period - elapsed + at
    end
  end
  st.remaining = m_max(0, idiv(full - used, period))
  st.reset = 0
  if cur > 0 then
    st.reset = 2 * period - elapsed
  elseif prev > 0 then
    st.reset = period - elapsed
  end
end

local function sw_apply(key, st, now, c, nonce, slack_ms)
  local period = c.period
  st.cur = st.cur + c.cost
  CALL('HSET', key, 'w', fmt(st.window), 'c', fmt(st.cur), 'p', fmt(st.prev))
  -- The count is needed until the end of the next window, where it stops weighing. That
  -- depends on the window alone, so the TTL is set once per window, by its first write.
  if st.stored ~= st.window then
    CALL('PEXPIRE', key, fmt(cell_ttl_ms(st.window + 2, period, now, slack_ms)))
  end
  local used = st.prev * (period - st.elapsed) + st.cur * period
  st.remaining = m_max(0, idiv(c.limit * period - used, period))
  st.reset = 2 * period - st.elapsed
end

local function sw_refund(key, now, c, nonce)
  -- `now` is the time of the hit being undone; its count is in window idiv(now, period),
  -- which may since have become the previous window.
  local window = idiv(now, c.period)
  local stored = num(CALL('HGET', key, 'w'))
  local field
  if stored == window then
    field = 'c'
  elseif stored == window + 1 then
    field = 'p'
  else
    return
  end
  local left = CALL('HINCRBY', key, field, -c.cost)
  if left < 0 then
    CALL('HSET', key, field, '0')
  end
end

ALG.sliding_window = {check = sw_check, apply = sw_apply, refund = sw_refund}
