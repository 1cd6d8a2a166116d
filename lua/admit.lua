-- admit.lua: one admission round of a sale's waiting room, on its gate.
--
-- The gate (in the sale's own slot) holds the line's cursor: every place at
-- or below it is admitted. A round moves the cursor over the next `count`
-- places the engine read from the fenced shards (line_fence.lua), so the
-- count is exact (places are unique, join.lua), and only if the admitted who
-- are not yet done, each counted at the units one admission may buy (the
-- per-user limit), stay within overbook x (remaining + held), and within
-- the admission rate.
-- Each round is recorded (its cursor and time) so a status read knows when
-- a place was admitted, and an admission window that passes frees its
-- places: a round past its window gives back what its users left undone.
--
-- KEYS[1] {fs:<sku>}:room    hash: cursor, admitted, open (admitted and not
--                            done), expired_cursor, last_ms, state
--                            ("open"/"sold_out"), flips, and per round
--                            c:<id> (admitted), d:<id> (done), t:<id> (ms)
-- KEYS[2] {fs:<sku>}:rounds  sorted set: member round id, score its cursor
-- ARGV[1] the cursor this round read (compare-and-set: another admitter's
--         round in between makes this one start again)
-- ARGV[2] the new cursor (>= ARGV[1])
-- ARGV[3] places in (ARGV[1], ARGV[2]] (exact: the shards are fenced)
-- ARGV[4] units remaining over all buckets, read by this round
-- ARGV[5] units held for payment, read by this round
-- ARGV[6] overbook factor (>= 1)
-- ARGV[7] admissions per second; 0 = auto (only the stock bounds it)
-- ARGV[8] admission window, ms
-- ARGV[9] channel a sold-out flip is published on
-- ARGV[10] units one admission may buy (the sale's per-user limit, >= 1)
-- ARGV[11] the gate's done_total as the engine read it before the stock:
--          purchases done since took units the stock read still shows, so
--          the limit's worth of each is taken off the remaining
--
-- Returns {code, a, b}:
--   {1, admitted, now_ms}   the cursor moved (admitted may be 0)
--   {2, cursor, 0}          another round moved the cursor first
--   {3, capacity, allow}    count is over what the stock or the rate allow
--   {-7, 0, 0}              invalid arguments
--
-- Checks come before the first write (expiring old rounds is a write, and
-- comes after them).

local function int(v)
  local n = tonumber(v)
  if not n or n < 0 or n > 9007199254740991 or n ~= math.floor(n) then
    return nil
  end
  return n
end
local from, to, count = int(ARGV[1]), int(ARGV[2]), int(ARGV[3])
local remaining, held = int(ARGV[4]), int(ARGV[5])
local overbook, rate, window = tonumber(ARGV[6]), tonumber(ARGV[7]), int(ARGV[8])
local limit, done_read = int(ARGV[10]), int(ARGV[11])
if not from or not to or not count or not remaining or not held or to < from
   or not overbook or overbook < 1 or not rate or rate < 0 or not window
   or window < 1 or not limit or limit < 1 or not done_read then
  return {-7, 0, 0}
end
local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor') or '0')
if cursor ~= from then
  return {2, cursor, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Places whose window has passed: what their users left undone is free.
local open = tonumber(redis.call('HGET', KEYS[1], 'open') or '0')
local expired = {}
local rounds = redis.call('ZRANGE', KEYS[2], 0, 63)
for _, id in ipairs(rounds) do
  local at = tonumber(redis.call('HGET', KEYS[1], 't:' .. id) or '0')
  if at + window > now then
    break
  end
  local c = tonumber(redis.call('HGET', KEYS[1], 'c:' .. id) or '0')
  local d = tonumber(redis.call('HGET', KEYS[1], 'd:' .. id) or '0')
  open = open - (c - d)
  expired[#expired + 1] = id
end
if open < 0 then
  open = 0
end

local done_now = tonumber(redis.call('HGET', KEYS[1], 'done_total') or '0')
local units = remaining + held - limit * math.max(0, done_now - done_read)
if units < 0 then
  units = 0
end
local capacity = math.floor(overbook * units / limit) - open
if capacity < 0 then
  capacity = 0
end
local allow = capacity
-- The rate is a token bucket: credit accrues from last_ms, at most one
-- admission's worth or one second's, whichever is longer (a rate below
-- 1/s still admits); each admission spends 1000 / rate ms of it.
local last = tonumber(redis.call('HGET', KEYS[1], 'last_ms') or '0')
local depth = 1000
if rate > 0 then
  depth = math.max(1000, math.ceil(1000 / rate))
  if now - last > depth then
    last = now - depth
  end
  allow = math.floor(rate * (now - last) / 1000)
end
if count > capacity or count > allow then
  return {3, capacity, allow}
end

-- Writes.
for _, id in ipairs(expired) do
  redis.call('HSET', KEYS[1], 'expired_cursor', id)
  redis.call('HDEL', KEYS[1], 'c:' .. id, 'd:' .. id, 't:' .. id)
  redis.call('ZREM', KEYS[2], id)
end
redis.call('HSET', KEYS[1], 'open', string.format('%d', open))
local state = 'open'
if remaining == 0 then
  state = 'sold_out'
end
-- A room starts open: only a change from what readers saw is a flip.
if (redis.call('HGET', KEYS[1], 'state') or 'open') ~= state then
  redis.call('HSET', KEYS[1], 'state', state)
  redis.call('HINCRBY', KEYS[1], 'flips', 1)
  redis.call('PUBLISH', ARGV[9], state)
end
if count > 0 or to > from then
  local id = string.format('%d', to)
  local spent = now
  if rate > 0 then
    spent = math.floor(last + count * 1000 / rate)
  end
  redis.call('HSET', KEYS[1], 'cursor', id, 'last_ms', string.format('%d', spent),
    'c:' .. id, string.format('%d', count), 'd:' .. id, '0',
    't:' .. id, string.format('%d', now))
  redis.call('HINCRBY', KEYS[1], 'admitted', count)
  redis.call('HINCRBY', KEYS[1], 'open', count)
  redis.call('ZADD', KEYS[2], id, id)
end
return {1, count, now}
