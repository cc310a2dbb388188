-- common.lua: helpers shared by the algorithm files; always the first part of the script.
--
-- Contract: defines no KEYS or ARGV of its own and returns nothing. It declares
--   CALL, num, s_*, m_*, t_unpack   redis.call, tonumber and the string, math and
--                       unpack functions the files use, bound by bind_globals();
--   ALG                 the table each algorithm file registers itself in, by name;
--   NONE, NEVER         the retry values "admitted, no wait" and "can never be admitted";
--   fmt(n)              an integer as exact decimal text;
--   idiv(a, b)          floor(a / b) for integers, exact below 2^53;
--   cdiv(a, b)          ceil(a / b) for integers, exact below 2^53;
--   expiry_cell(t, g)   which cell of a grid of `g` µs the time `t` expires in;
--   cell_ttl_ms(...)    the PEXPIRE that ends a key with such a cell;
--   spec_of(text)       a check's spec (see decide.lua) as the table the algorithms read,
--                       {alg, limit, period, cost, burst, shadow, cost_text}, or
--                       {error = reply text};
--   NOW_SEC, NOW_USEC, NOW_TEXT, USEC_PAD  the call's time as text (see below);
--   CHECKS, STATES, OUTS  decide.lua's tables of a call's specs, states and reply, reused.
-- Every time is an integer number of microseconds; every count an integer.
--
-- Text Redis gave us that is known to hold a number (a TIME field, a score, digits a
-- pattern matched) is turned into one by arithmetic (`s + 0`), not with num: Lua 5.1's
-- tonumber converts its argument twice (it asks whether it is a number, then converts),
-- each time with the C library's strtod. num stays where a value may be missing or not a
-- number (it returns nil there; arithmetic raises). The numbers the calls send are text:
-- Redis formats a Lua number argument with "%.17g". Those conversions and that
-- formatting were about a sixth of a sliding_log decision's instructions in Redis
-- (bench/profiles/README.md, "In Redis").

-- The globals a decision reads most, as upvalues (cheaper than a global lookup). A
-- library sees no globals while it loads, so decide.lua binds them (bind_globals) on
-- its first call; a Function library's locals then keep them until it is reloaded
-- (binding them on every call cost about 4,000 instructions a decision in Redis).
-- An EVAL script runs this file anew on every call, so there they are bound every time.
local CALL, num, s_format, s_match, s_byte, s_sub, m_floor, m_max, m_min, t_unpack
local function bind_globals()
  CALL, num, t_unpack = redis.call, tonumber, unpack
  s_format, s_match, s_byte = string.format, string.match, string.byte
  s_sub = string.sub
  m_floor, m_max, m_min = math.floor, math.max, math.min
end

local ALG = {}
local NONE = -1
local NEVER = -2

-- Lua 5.1 prints numbers with 14 significant digits ("1.7e+15"), which would merge
-- distinct timestamps; %d prints the exact integer.
local function fmt(n)
  return s_format('%d', n)
end

-- The call's time as text, for a write scored `now` (the sliding log's ZADD, which makes
-- it at most once per call, from TIME's two fields without formatting a number; the
-- other algorithms never need it). decide.lua sets NOW_SEC and NOW_USEC (TIME's fields,
-- or false under a test clock) and clears NOW_TEXT before any check runs; Function
-- library locals, like CHECKS below.
local NOW_SEC, NOW_USEC, NOW_TEXT = false, false, false
-- Zeros that pad TIME's microseconds (1 to 6 digits) to six.
local USEC_PAD = {'00000', '0000', '000', '00', '0', ''}

-- a / b in doubles can round up to the next integer when the quotient is large; check the
-- candidate with exact integer products and step back or forward once.
local function idiv(a, b)
  local q = m_floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  return -idiv(-a, b)
end

-- Expiries are rounded up to the end of a grid cell (one period wide): a key must outlive
-- its state's deadline t, and it does until the end of t's cell. As long as successive
-- deadlines stay in one cell the TTL already set is right, so the write that would move it
-- (PEXPIRE, or SET with PX, the costliest part of a decision in Redis) is skipped. A key
-- outlives its state by less than one period.
local function expiry_cell(t, g)
  return idiv(t, g) + 1
end

-- The PEXPIRE (ms from now) that ends the key with cell `cell` of a grid of `g` µs.
local function cell_ttl_ms(cell, g, now, slack_ms)
  return cdiv(cell * g - now, 1000) + slack_ms
end

-- The checks' specs, parsed once per library load: a spec is one argument
-- "<algorithm> <limit> <period µs> <cost> <burst> <flags 0-3>", and nearly every call
-- repeats the few that a policy's limits and tiers make. The table is the library's own
-- (a Function library's locals live until it is reloaded; an EVAL script makes it anew
-- per call, so there it saves nothing and costs nothing). A parsed spec is never
-- written to. Cost is part of the spec, so a caller that sends many costs could grow
-- the table: it is emptied when it holds SPEC_CACHE_SIZE specs.
local SPEC_CACHE_SIZE = 1024
local SPECS = {}
local n_specs = 0
local function spec_of(text)
  local c = SPECS[text]
  if c then
    return c
  end
  local name, limit, period, cost, burst, flags =
    s_match(text or '', '^([%l_]+) (%d+) (%d+) (%d+) (%d+) ([0-3])$')
  if not name then
    return {error = 'ERR applimit: malformed check ' .. tostring(text)}
  end
  local alg = ALG[name]
  if alg == nil then
    return {error = 'ERR applimit: unknown algorithm ' .. name}
  end
  c = {
    alg = alg, limit = num(limit), period = num(period), cost = num(cost),
    burst = num(burst), shadow = flags == '1' or flags == '3', after = flags >= '2',
  }
  -- The cost as a sliding-log member writes it (exact decimal, whatever the digits sent).
  c.cost_text = fmt(c.cost)
  if n_specs >= SPEC_CACHE_SIZE then
    SPECS = {}
    n_specs = 0
  end
  SPECS[text] = c
  n_specs = n_specs + 1
  return c
end

-- decide.lua's per-call tables: the specs of the call's checks, each check's state (the
-- table its check fills and its apply reads), and the reply of a call of n checks
-- (OUTS[n]: Redis reads the array up to its first nil, so each size has its own table,
-- always filled whole). Made once per library load and refilled by every call, instead
-- of made (and collected) anew: entries past a call's checks in CHECKS and STATES are
-- left from earlier calls and never read, and Redis has copied a reply before the next
-- call. A script is never re-entered, so one set is enough. In an EVAL script they are
-- new on every call.
local CHECKS = {}
local STATES = {}
local OUTS = {}
