-- lock_release.lua: release a lock only if this grant holds it, and wake the
-- waiters.
--
-- KEYS[1] flashsale:lock:<name>   the lock
-- ARGV[1] token of the grant releasing it
-- ARGV[2] pub/sub channel the waiters listen on
-- ARGV[3] lock name, published on ARGV[2]
--
-- Returns 1 when released, 0 when this token did not hold it (expired, or
-- another owner's now).
--
-- Invariant: nobody releases a lock they do not hold.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
