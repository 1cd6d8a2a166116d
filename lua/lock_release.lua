-- lock_release.lua: release a lock only if this grant holds it, and wake the
-- waiters, if there are any.
--
-- KEYS[1] flashsale:lock:<name>      the lock
-- KEYS[2] flashsale:waiters:<name>   how many clients wait for it (lock_waiting.lua)
-- ARGV[1] token of the grant releasing it
-- ARGV[2] pub/sub channel the waiters listen on
-- ARGV[3] lock name, published on ARGV[2]
--
-- Returns 1 when released, 2 when released and others wait for it (a
-- wake-up went out), 0 when this token did not hold it (expired, or another
-- owner's now).
--
-- Invariant: nobody releases a lock they do not hold. Publishing only when
-- someone waits keeps the uncontended path at one round trip and spares
-- every subscriber a message per release.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then
    redis.call('PUBLISH', ARGV[2], ARGV[3])
    return 2
  end
  return 1
end
return 0
