-- sliding_log.lua: the exact sliding-window log, one entry per admitted request.
--
-- KEYS: one sorted set per check. Each admitted request is one member scored with its
--   admission time; the window is (now - period, now]. The member is
--   "<start>.<cost>.<nonce>": `cost` is what the request counted, `start` how many units
--   the key had admitted before it (after a letter giving its length, so that members
--   sort as their starts do: "B42.1.9f86d081884c"). Scores never decrease from one entry
--   to the next (an entry is scored at least its predecessor's time), and equal scores
--   sort by `start`, so the sorted set's order is admission order and the
--   units in the window are the newest entry's start + cost minus the oldest in-window
--   entry's start: two reads, whatever the costs. Memory and time go with the number of
--   requests, never with their cost. Earlier versions wrote one member per unit of cost,
--   "<nonce>.<i>" (0.1: "<nonce>:<i>"); a check that finds such members rewrites them in
--   this form first, one unit each (see log_convert).
-- ARGV: none of its own; decide.lua passes each check as the table
--   c = {limit, period (µs), cost, burst (unused), shadow}.
-- Functions (registered as ALG.sliding_log):
--   check(key, now, c, slack_ms, st) fills st (every field); writes only to convert
--                                    members of older versions
--   apply(key, st, now, c, nonce, slack_ms)  adds the entry, trims every TRIM_EVERY
--                                    units; PEXPIRE when the newest entry's expiry cell
--                                    (common.lua) changes
--   refund(key, now, c, nonce)       removes the entry an earlier apply added
-- Returns (in st): allowed (0/1), remaining, reset (µs until every entry has left the
--   window), retry (µs until `cost` fits: when the oldest entries holding the units that
--   must go have left; NONE when allowed, NEVER when cost > limit).
--
-- Fixed against the usual sorted-set script: entries are added only when admitted;
-- members are unique (by `start`) and never built from formatted floats; the TTL is
-- rounded up and always outlives the newest entry; a cost above what is left is rejected
-- without writing; a request of any cost is one member.

local CHUNK = 500
-- (The number of entries is read with ZCOUNT -inf +inf rather than ZCARD, so that an ACL
-- needs only the commands docs/applimit.md lists.)
-- Starts are rewritten from 0 once they pass this (2^50), far below 2^53, where doubles
-- stop being exact.
local REBASE_AT = 1125899906842624
-- How often (in units admitted) apply trims the entries that left the window.
local TRIM_EVERY = 16

-- A member of this version opens with a capital letter (the length of its start); older
-- versions' open with their nonce's lowercase hex.
local function log_current(member)
  local first = s_byte(member, 1)
  return first >= 65 and first <= 90
end

-- A member's start and cost (nil for an older version's member).
local function log_units(member)
  local start, cost = s_match(member, '^%u(%d+)%.(%d+)%.')
  if start then
    return start + 0, cost + 0
  end
end

-- The start is written after a letter that gives its number of digits (A for 1, B for
-- 2, ... P for 16): members then sort as their starts do, without zero padding. `cost` is
-- text (a check's own is its spec's cost_text, formatted once per spec).
local LETTERS = {'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I', 'J', 'K', 'L', 'M', 'N', 'O', 'P'}
local function log_member(start, cost, tail)
  local digits = fmt(start)
  return LETTERS[#digits] .. digits .. '.' .. cost .. '.' .. tail
end

-- The start of a member of this version (whose first byte is `letter`): the digits after
-- the letter, without a pattern match (the oldest entry's cost is needed only on denial).
local function log_start(member, letter)
  return s_sub(member, 2, letter - 63) + 0
end

-- ZADD or ZREM of many members, in chunks (Lua's stack bounds unpack).
local function log_each(command, key, args)
  for i = 1, #args, CHUNK do
    CALL(command, key, t_unpack(args, i, m_min(#args, i + CHUNK - 1)))
  end
end

-- Members written by an older version, rewritten in this version's form (one unit each),
-- in their order: those at the end of the set (all of them, on a key only older versions
-- wrote; else those written since this version's last entry), or with `whole` every
-- entry in the window, renumbered from 0 (for an older member found elsewhere: written
-- while the clock went back). Entries that left the window go; the TTL is set on the
-- expiry grid (applimit 0.1 set it to end exactly at the deadline). Once per key, then
-- once per write of an older version (during a rolling upgrade).
local function log_convert(key, now, c, floor, slack_ms, whole)
  local entries, base = {}, 0
  if whole then
    entries = CALL('ZRANGEBYSCORE', key, s_format('(%d', floor), '+inf', 'WITHSCORES')
  else
    -- Back from the end, to this version's newest entry or the window's floor.
    local tail, done = {}, false
    local at = CALL('ZCOUNT', key, '-inf', '+inf')
    while at > 0 and not done do
      local from = m_max(0, at - CHUNK)
      local part = CALL('ZRANGE', key, from, at - 1, 'WITHSCORES')
      for i = #part - 1, 1, -2 do
        if log_current(part[i]) then
          local start, cost = log_units(part[i])
          base = start + cost
          done = true
          break
        elseif num(part[i + 1]) <= floor then
          done = true
          break
        end
        tail[#tail + 1] = part[i + 1]
        tail[#tail + 1] = part[i]
      end
      at = from
    end
    for i = #tail, 1, -1 do
      entries[#entries + 1] = tail[i]
    end
  end
  local added, gone = {}, {}
  for i = 1, #entries, 2 do
    local member = entries[i]
    local cost, rest = 1, member
    if log_current(member) then
      local _, units, tail = s_match(member, '^%u(%d+)%.(%d+)%.(.*)$')
      cost, rest = num(units), tail
    end
    local renamed = log_member(base, fmt(cost), rest)
    if renamed ~= member then
      added[#added + 1] = entries[i + 1]
      added[#added + 1] = renamed
      gone[#gone + 1] = member
    end
    base = base + cost
  end
  -- Adding first (see decide.lua: a full server must refuse the write as a whole).
  log_each('ZADD', key, added)
  log_each('ZREM', key, gone)
  CALL('ZREMRANGEBYSCORE', key, '-inf', fmt(floor))
  local newest = num(entries[#entries])
  local cell = expiry_cell(newest + c.period, c.period)
  CALL('PEXPIRE', key, fmt(cell_ttl_ms(cell, c.period, now, slack_ms)))
end

-- The score of the oldest entry in the window whose start + cost reaches `target`, from
-- rank `lo` to `hi` (the set's order is admission order, so start + cost grows with the
-- rank); nil if it meets a member of an older version.
local function log_reaching(key, target, lo, hi)
  while lo < hi do
    local mid = m_floor((lo + hi) / 2)
    local start, cost = log_units(CALL('ZRANGE', key, mid, mid)[1])
    if not start then
      return nil
    elseif start + cost >= target then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return num(CALL('ZRANGE', key, lo, lo, 'WITHSCORES')[2])
end

local log_check
log_check = function(key, now, c, slack_ms, st)
  local floor = now - c.period
  -- Every field the check and apply read, set afresh: st is reused from call to call (see
  -- decide.lua; remaining and reset are set at the end, consumed by decide.lua). newest is
  -- false without entries; start is where the next entry starts (0 when nothing is in
  -- the window).
  st.count, st.allowed, st.retry = 0, 0, NONE
  st.newest, st.grid, st.floor, st.trim, st.start = false, false, floor, false, 0
  local last = CALL('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  local first_member, first_start
  if last[2] then
    local newest, current = last[2] + 0, log_current(last[1])
    if newest > floor and not current then
      log_convert(key, now, c, floor, slack_ms, false)
      last = CALL('ZRANGE', key, '-1', '-1', 'WITHSCORES')
      newest, current = last[2] + 0, log_current(last[1])
    end
    -- The key's TTL was last set for the newest entry, on the grid if it is this
    -- version's (applimit 0.1 set it to end at the entry's deadline).
    st.newest, st.grid = newest, current
    if newest > floor then
      local start, cost = log_units(last[1])
      st.start = start + cost
      -- The oldest entry in the window (the bound's text in one format, without a
      -- concatenation); entries before it may remain (see log_apply).
      local first = CALL('ZRANGEBYSCORE', key, s_format('(%d', floor), '+inf', 'LIMIT', '0', '1')[1]
      -- log_current's test, on the first byte read once for log_start too.
      local letter = s_byte(first, 1)
      if letter < 65 or letter > 90 then
        -- An older member inside the window (not at its end): renumber the window.
        log_convert(key, now, c, floor, slack_ms, true)
        return log_check(key, now, c, slack_ms, st)
      end
      first_member, first_start = first, log_start(first, letter)
      st.count = st.start - first_start
    else
      st.trim = true
    end
  end
  local count = st.count
  if c.cost <= c.limit - count then
    st.allowed = 1
  elseif c.cost > c.limit then
    st.retry = NEVER
  else
    -- The request fits once `need` of the units now in the window have left it: when
    -- the oldest entry whose start + cost reaches first_start + need leaves.
    local need = count + c.cost - c.limit
    local at
    local _, first_cost = log_units(first_member)
    if first_cost >= need then
      at = num(CALL('ZRANGEBYSCORE', key, s_format('(%d', floor), '+inf', 'WITHSCORES', 'LIMIT', '0', '1')[2])
    else
      local lo = CALL('ZCOUNT', key, '-inf', fmt(floor)) + 1
      local last_rank = CALL('ZCOUNT', key, '-inf', '+inf') - 1
      at = log_reaching(key, first_start + need, lo, last_rank)
      if not at then
        log_convert(key, now, c, floor, slack_ms, true)
        return log_check(key, now, c, slack_ms, st)
      end
    end
    st.retry = at + c.period - now
  end
  st.remaining = c.limit - count
  st.reset = 0
  if count > 0 then
    st.reset = st.newest + c.period - now
  end
end

-- Starts from 0 again (rare: after 2^50 units without the key ever expiring). Returns the
-- start of the next entry.
local function log_rebase(key, st)
  local entries = CALL('ZRANGEBYSCORE', key, s_format('(%d', st.floor), '+inf', 'WITHSCORES')
  local shift = log_units(entries[1])
  local added, gone = {}, {}
  for i = 1, #entries, 2 do
    local start, cost = log_units(entries[i])
    added[#added + 1] = entries[i + 1]
    added[#added + 1] = log_member(start - shift, fmt(cost), s_match(entries[i], '^%u%d+%.%d+%.(.*)$'))
    gone[#gone + 1] = entries[i]
  end
  log_each('ZADD', key, added)
  log_each('ZREM', key, gone)
  return st.start - shift
end

local function log_apply(key, st, now, c, nonce, slack_ms)
  -- An entry is scored no earlier than the newest (later than `now` only if the clock
  -- went back), so that the set's order stays admission order.
  local score = now
  if st.newest and st.newest > now then
    score = st.newest
  end
  local start = st.start
  if start > REBASE_AT then
    -- Entries past the window keep their old starts: they go now.
    start = log_rebase(key, st)
    st.trim = true
  end
  -- The entry first (see decide.lua: a full server must refuse the write as a whole).
  -- The score's text: the call's time (made once per call, see common.lua), unless the
  -- clock went back.
  local score_text = NOW_TEXT
  if score ~= now then
    score_text = fmt(score)
  elseif not score_text then
    score_text = NOW_SEC and NOW_SEC .. USEC_PAD[#NOW_USEC] .. NOW_USEC or fmt(now)
    NOW_TEXT = score_text
  end
  CALL('ZADD', key, score_text, log_member(start, c.cost_text, nonce))
  -- Entries that left the window are trimmed (everything at or before the floor check()
  -- counted from) when nothing else is in the window, and else each time the starts
  -- cross a multiple of TRIM_EVERY units (of the limit, when it is smaller): not at every
  -- entry, since a key at a steady rate has an entry leave the window with nearly every
  -- request, and finding out costs a read. A trim leaves at most `limit` entries (the
  -- window's), and fewer than `every` are added before the next, so a key never holds
  -- more than limit + every - 1 entries. Counts never include the ones past the window:
  -- they start from its oldest entry.
  local every = m_min(TRIM_EVERY, c.limit)
  if st.trim or idiv(start + c.cost, every) ~= idiv(start, every) then
    CALL('ZREMRANGEBYSCORE', key, '-inf', fmt(st.floor))
  end
  st.count = st.count + c.cost
  st.remaining = c.limit - st.count
  st.reset = score + c.period - now
  -- The key must live until its newest entry leaves the window: until the end of that
  -- time's expiry cell, which is where the TTL already ends if the previous newest entry
  -- (written on the grid) left the window in the same cell.
  local cell = expiry_cell(score + c.period, c.period)
  if not st.grid or expiry_cell(st.newest + c.period, c.period) ~= cell then
    CALL('PEXPIRE', key, fmt(cell_ttl_ms(cell, c.period, now, slack_ms)))
  end
end

local function log_refund(key, now, c, nonce)
  -- The entry is scored `now` (the hit's time) or later; the entries after it start
  -- `cost` units earlier once it is gone.
  local entries = CALL('ZRANGEBYSCORE', key, fmt(now), '+inf', 'WITHSCORES')
  local cost = nil
  local added, gone = {}, {}
  for i = 1, #entries, 2 do
    local start, units, tail = s_match(entries[i], '^%u(%d+)%.(%d+)%.(.*)$')
    if not start then
      -- Written by an older version since: converted by the next check.
    elseif cost then
      added[#added + 1] = entries[i + 1]
      added[#added + 1] = log_member(num(start) - cost, units, tail)
      gone[#gone + 1] = entries[i]
    elseif tail == nonce then
      cost = num(units)
      gone[#gone + 1] = entries[i]
    end
  end
  log_each('ZADD', key, added)
  log_each('ZREM', key, gone)
end

ALG.sliding_log = {check = log_check, apply = log_apply, refund = log_refund}
