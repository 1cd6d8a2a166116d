-- rate_limit.lua: the seeds' fixed-window rate limit, kept so the benchmark
-- can measure it against flashsale's in-process limiter ("which costs less at
-- the door"). flashsale serve does not call it.
--
-- KEYS[1] {rl:<user>}:<window>   requests of this user in this window
-- ARGV[1] most requests allowed per window
-- ARGV[2] window length in milliseconds
--
-- Returns 1 when the request is allowed, 0 when it is over the limit.
--
-- Invariant: at most ARGV[1] requests per user per window are allowed.

local n = redis.call('INCR', KEYS[1])
if n == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if n <= tonumber(ARGV[1]) then
  return 1
end
return 0
