-- lock_extend.lua: renew a lock's lease only if this grant holds it
-- (the watchdog's renewal).
--
-- KEYS[1] flashsale:lock:<name>   the lock
-- ARGV[1] token of the grant
-- ARGV[2] new ttl in milliseconds
--
-- Returns 1 when extended, 0 when this token does not hold it.
--
-- Invariant: nobody extends a lock they do not hold, and a released lock is
-- never brought back (PEXPIRE on a missing key does nothing).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
