-- common.lua: helpers shared by the algorithm files; always the first part of the script.
--
-- Contract: defines no KEYS or ARGV of its own and returns nothing. It declares
--   ALG                 the table each algorithm file registers itself in, by name;
--   NONE, NEVER         the retry values "admitted, no wait" and "can never be admitted";
--   fmt(n)              an integer as exact decimal text;
--   idiv(a, b)          floor(a / b) for integers, exact below 2^53;
--   cdiv(a, b)          ceil(a / b) for integers, exact below 2^53.
-- Every time is an integer number of microseconds; every count an integer.

local ALG = {}
local NONE = -1
local NEVER = -2

-- Lua 5.1 prints numbers with 14 significant digits ("1.7e+15"), which would merge
-- distinct timestamps; %d prints the exact integer.
local function fmt(n)
  return string.format('%d', n)
end

-- a / b in doubles can round up to the next integer when the quotient is large; check the
-- candidate with exact integer products and step back or forward once.
local function idiv(a, b)
  local q = math.floor(a / b)
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
