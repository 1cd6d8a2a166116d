-- line_fence.lua: raise one line shard's floor before an admission round
-- reads it, so the places the round counts can no longer change: a join
-- that arrives after the fence gets a place above it (join.lua).
--
-- KEYS[1] {tag}:lineh  hash, field "f" the floor (see join.lua)
-- ARGV[1] the fence (integer 0..2^53-1)
--
-- Returns {code, floor}:
--   {1, floor}   the floor now (never lowered: the old one when higher)
--   {-7, 0}      invalid arguments

local MAX = 9007199254740991
local fence = tonumber(ARGV[1])
if not fence or fence < 0 or fence > MAX or fence ~= math.floor(fence) then
  return {-7, 0}
end
local floor = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
if fence > floor then
  redis.call('HSET', KEYS[1], 'f', string.format('%d', fence))
  floor = fence
end
return {1, floor}
