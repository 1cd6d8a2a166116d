-- lock_acquire.lua: try to take a lock on one lock node (SET NX PX), and
-- report the node's fencing counter either way.
--
-- KEYS[1] flashsale:lock:<name>    the lock; its value is the grant's random token
-- KEYS[2] flashsale:fence:<name>   highest fencing token this node has seen
-- ARGV[1] token of this grant attempt
-- ARGV[2] ttl in milliseconds
--
-- Returns {granted, pttl, fence}:
--   {1, ttl, "<fence>"}    taken on this node
--   {0, pttl, "<fence>"}   held by another token; pttl = its remaining ms
-- fence is a decimal string ("0" when unknown), kept as text so a value past
-- 2^53 never passes through a Lua number.
--
-- Invariant: a held lock is never overwritten (NX), so at most one token
-- holds the key on this node at a time.

local fence = redis.call('GET', KEYS[2]) or '0'
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, tonumber(ARGV[2]), fence}
end
return {0, redis.call('PTTL', KEYS[1]), fence}
