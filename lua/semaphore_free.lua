-- semaphore_free.lua: which permit slots of a semaphore are free on one lock
-- node, so a taker tries only those (one call per look, not one per slot).
--
-- KEYS[i] flashsale:lock:sem:<name>:<i-1>   the lock of slot i-1
-- (no ARGV)
--
-- Returns one integer per slot, in order: 1 when no grant holds it here,
-- else 0.
--
-- Invariant: reads only; a slot reported free may be taken a moment later,
-- which the lock's own SET NX decides.

local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('EXISTS', KEYS[i]) == 0 and 1 or 0
end
return out
