-- sliding_log.lua: the exact sliding-window log.
--
-- KEYS: one sorted set per check. Each admitted unit of cost is one member "<nonce>.<i>"
--   scored with its admission time; the window is (now - period, now].
-- ARGV: none of its own; decide.lua passes each check as the table
--   c = {limit, period (µs), cost, burst (unused), shadow}.
-- Functions (registered as ALG.sliding_log):
--   check(key, now, c)               -> st, reads only
--   apply(key, st, now, c, nonce, slack_ms)  adds the entries, trims; PEXPIRE when the
--                                    newest entry's expiry cell (common.lua) changes
--   refund(key, now, c, nonce)       removes the entries an earlier apply added
-- Returns (in st): allowed (0/1), remaining, reset (µs until every entry has left the
--   window), retry (µs until `cost` fits: when the oldest entry that matters leaves; NONE
--   when allowed, NEVER when cost > limit).
--
-- Fixed against the usual sorted-set script: entries are added only when admitted;
-- members are unique per call and never built from formatted floats; the TTL is rounded
-- up and always outlives the newest entry; a cost above what is left is rejected without
-- writing.

local ZADD_CHUNK = 500

-- The newest entry's score, and whether the key's TTL was set for it on the expiry grid
-- (its member is "<nonce>.<i>"; applimit 0.1 wrote "<nonce>:<i>" and a TTL ending exactly
-- when the entry leaves the window).
local function log_newest(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    return tonumber(last[2]), string.find(last[1], '.', 1, true) ~= nil
  end
  return nil, false
end

local function log_check(key, now, c)
  local floor_s = fmt(now - c.period)
  local lower = '(' .. floor_s
  local count = redis.call('ZCOUNT', key, lower, '+inf')
  -- Every field the check and apply set, made at once: adding fields later would make
  -- Lua grow the table (a rehash) on every call. newest is false until read.
  local st = {
    count = count, allowed = 0, retry = NONE, remaining = 0, reset = 0, consumed = 0,
    newest = false, grid = false, floor_s = floor_s,
  }
  if c.cost <= c.limit - count then
    st.allowed = 1
  elseif c.cost > c.limit then
    st.retry = NEVER
  else
    -- The request fits once `need` of the entries now in the window have left it; the
    -- need-th oldest leaves at its score + period.
    local need = count + c.cost - c.limit
    local entry = redis.call('ZRANGEBYSCORE', key, lower, '+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
    st.retry = tonumber(entry[2]) + c.period - now
  end
  st.remaining = c.limit - count
  st.reset = 0
  if count > 0 then
    -- The newest entry is in the window, so it is the newest in the set: the key's TTL
    -- was last set for it.
    st.newest, st.grid = log_newest(key)
    st.reset = st.newest + c.period - now
  end
  return st
end

local function log_apply(key, st, now, c, nonce, slack_ms)
  -- Everything at or before the window's floor (the floor check() counted from).
  redis.call('ZREMRANGEBYSCORE', key, '-inf', st.floor_s)
  local score = fmt(now)
  local i = 1
  if c.cost == 1 then
    -- Nearly every request: one entry, without building an argument table.
    redis.call('ZADD', key, score, nonce .. '.1')
    i = 2
  end
  while i <= c.cost do
    local args = {}
    local last = math.min(c.cost, i + ZADD_CHUNK - 1)
    for j = i, last do
      args[#args + 1] = score
      args[#args + 1] = nonce .. '.' .. fmt(j)
    end
    redis.call('ZADD', key, unpack(args))
    i = last + 1
  end
  st.count = st.count + c.cost
  st.remaining = c.limit - st.count
  -- An entry scored after `now` exists only if the clock went back; it outlives `now`.
  local newest = now
  if st.newest and st.newest > now then
    newest = st.newest
  end
  st.reset = newest + c.period - now
  -- The key must live until its newest entry leaves the window: until the end of that
  -- time's expiry cell, which is where the TTL already ends if the previous newest entry
  -- (written on the grid) left the window in the same cell.
  local cell = expiry_cell(newest + c.period, c.period)
  if not st.grid or expiry_cell(st.newest + c.period, c.period) ~= cell then
    redis.call('PEXPIRE', key, cell_ttl_ms(cell, c.period, now, slack_ms))
  end
end

local function log_refund(key, now, c, nonce)
  local i = 1
  while i <= c.cost do
    local members = {}
    local last = math.min(c.cost, i + ZADD_CHUNK - 1)
    for j = i, last do
      members[#members + 1] = nonce .. '.' .. fmt(j)
    end
    redis.call('ZREM', key, unpack(members))
    i = last + 1
  end
end

ALG.sliding_log = {check = log_check, apply = log_apply, refund = log_refund}
