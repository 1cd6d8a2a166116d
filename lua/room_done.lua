-- room_done.lua: an admitted user's purchase was decided (confirmed or
-- refused), so their place among the admitted-not-done is free again; once
-- per user and sale.
--
-- KEYS[1] {fs:<sku>}:room    the gate hash (admit.lua)
-- KEYS[2] {fs:<sku>}:rounds  the rounds not yet past their window
-- KEYS[3] {fs:<sku>}:done    set of users whose admission was used
-- ARGV[1] user
-- ARGV[2] the user's place (the admission says it)
--
-- Every first use counts in the gate's done_total (a purchase took units:
-- admit.lua takes them off a stock read older than it). The place is freed
-- only if its round is still in its window: a round past it was freed by
-- admit.lua then, and a later round (the first with a cursor at or above
-- the place, once the user's own has gone) is not this user's.
--
-- Returns {code}:
--   {1}   freed now
--   {2}   this user was done before, or their round's window has passed
--         (admit.lua freed it then): no place freed
--   {-7}  invalid arguments

local place = tonumber(ARGV[2])
if ARGV[1] == '' or not place or place < 0 then
  return {-7}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then
  return {2}
end
local expired = tonumber(redis.call('HGET', KEYS[1], 'expired_cursor') or '0')
local round = nil
if place > expired then
  round = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[2], '+inf', 'LIMIT', 0, 1)[1]
end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'done_total', 1)
if not round then
  return {2}
end
redis.call('HINCRBY', KEYS[1], 'd:' .. round, 1)
redis.call('HINCRBY', KEYS[1], 'open', -1)
return {1}
