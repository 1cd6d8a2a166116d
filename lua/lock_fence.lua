-- lock_fence.lua: raise a node's fencing counter to a new grant's token.
--
-- KEYS[1] flashsale:fence:<name>   highest fencing token this node has seen
-- ARGV[1] the new grant's fencing token (decimal)
--
-- Returns the counter after the call (decimal string): ARGV[1], or a higher
-- value already there.
--
-- Invariant: the counter never goes down, so any later quorum that overlaps
-- this grant's quorum sees at least this token.

local cur = redis.call('GET', KEYS[1])
if cur and (string.len(cur) > string.len(ARGV[1]) or (string.len(cur) == string.len(ARGV[1]) and cur >= ARGV[1])) then
  return cur
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
