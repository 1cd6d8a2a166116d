-- lock_waiting.lua: count a client in (or out of) the waiters of a lock, so
-- releases know whether to publish a wake-up.
--
-- KEYS[1] flashsale:waiters:<name>   number of clients waiting
-- ARGV[1] +1 (starts waiting) or -1 (stops waiting)
-- ARGV[2] ms the count lives without updates (a waiter that died without
--         counting itself out costs only extra wake-ups until then)
--
-- Returns the count after the change.
--
-- Invariant: the count never stays below zero.

local n = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
if n <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
-- Only ever lengthened: a short waiter counting itself in or out must not
-- cut the count's life below a longer waiter's wait (the count would then
-- vanish, releases would publish nothing, and that waiter would sleep until
-- the holder's lease ends).
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return n
