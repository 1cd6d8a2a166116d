-- lock_dequeue.lua: take a waiter's entry out of a lock's queue (it gave
-- up, was cancelled, or holds the lock now through the other nodes).
--
-- KEYS[1] the queue (flashsale:fairq:<name> or flashsale:rwq:<name>)
-- KEYS[2] the queue's expiry index (flashsale:fairq-exp:<name>), or KEYS[1]
--         again when the queue has none
-- ARGV[1] the waiter's id
--
-- Returns how many entries went (0 when it had left already).
--
-- Invariant: only the caller's own entry is touched.

local n = redis.call('ZREM', KEYS[1], ARGV[1])
if KEYS[2] ~= KEYS[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return n
