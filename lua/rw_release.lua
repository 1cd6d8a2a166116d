-- rw_release.lua: release one holder of a read-write lock only if it still
-- holds it, and wake the waiters, if there are any.
--
-- KEYS[1] flashsale:rw:<name>          the holders (see rw_acquire.lua)
-- KEYS[2] flashsale:rwwaiters:<name>   how many clients wait (lock_waiting.lua)
-- ARGV[1] the holder's field: "r:<token>" or "w:<token>"
-- ARGV[2] pub/sub channel the waiters listen on
-- ARGV[3] the name published on ARGV[2]
--
-- Returns 1 when released, 0 when this holder was not there or its lease
-- had ended (then its stale field goes too).
--
-- Invariant: nobody releases a hold that is not theirs, and a hold whose
-- lease ended is never reported released.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if ends == 0 then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
if ends <= now then
  return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
