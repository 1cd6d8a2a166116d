-- join.lua: put a user in one shard of a sale's waiting line, once.
--
-- The line of a sale is split over shards, one per stock bucket, in the
-- bucket's slot (so a million joins spread over the sale's masters); a user
-- always joins the shard of their home bucket. A place is a score: lower is
-- earlier. The engine proposes it (a keyed hash of the user before a
-- shuffled start, an arrival stamp after); the script keeps a join
-- idempotent and never lets a new place land at or below the shard's
-- floor, the highest place an admission round may already have counted.
--
-- KEYS[1] {tag}:line   sorted set, member user, score place
-- KEYS[2] {tag}:lineh  hash: "f" the floor; "h<n>" joins whose place is in
--                      cell n, the histogram status reads count "ahead"
--                      from: cell n is [n * 2^30, (n + 1) * 2^30) for a
--                      shuffled place (below 2^40), 1024 + 100 ms of
--                      arrivals (409,600 stamps) above (room/place.rs)
-- ARGV[1] user
-- ARGV[2] proposed place (integer 0..2^53-1)
-- ARGV[3] this shard's index, 0..63: a place's last 6 bits, so no two
--         shards hand out the same place
--
-- Places are unique: the gate admits by counting places up to a cursor,
-- and a group of joins on one place larger than a round may admit could
-- never be admitted (the line would stop).
--
-- Returns {code, place}:
--   {1, place}   joined now
--   {2, place}   had joined before: the first place, unchanged
--   {-7, 0}      invalid arguments
--
-- Checks come before the first write.

local MAX = 9007199254740991
local SLOTS = 64
local proposed, shard = tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[1] == '' or not proposed or proposed < 0 or proposed > MAX - 2 * SLOTS
   or proposed ~= math.floor(proposed) or not shard or shard < 0
   or shard >= SLOTS or shard ~= math.floor(shard) then
  return {-7, 0}
end
local had = redis.call('ZSCORE', KEYS[1], ARGV[1])
if had then
  return {2, tonumber(had)}
end
local function on_shard(p)
  return p - (p % SLOTS) + shard
end
local function fmt(p)
  -- Lua 5.1 prints a number with 14 digits; a place has up to 16.
  return string.format('%d', p)
end
local floor = tonumber(redis.call('HGET', KEYS[2], 'f') or '0')
local place = on_shard(proposed)
if place <= floor then
  -- Lifted above a fence (a clock behind the fencer's): after everyone
  -- already in this shard, not beside them.
  local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
  local base = floor
  if top and tonumber(top) > base then
    base = tonumber(top)
  end
  place = on_shard(base)
  if place <= base then
    place = place + SLOTS
  end
end
while redis.call('ZCOUNT', KEYS[1], fmt(place), fmt(place)) > 0 do
  place = place + SLOTS
end
if place > MAX then
  return {-7, 0}
end
redis.call('ZADD', KEYS[1], fmt(place), ARGV[1])
local cell
if place < 1099511627776 then
  cell = math.floor(place / 1073741824)
else
  cell = 1024 + math.floor((place - 1099511627776) / 409600)
end
redis.call('HINCRBY', KEYS[2], 'h' .. string.format('%d', cell), 1)
return {1, place}
