-- lock_fair_acquire.lua: take a lock on one lock node only when the caller
-- is the first live waiter in the lock's queue (a fair lock), and report the
-- node's fencing counter either way.
--
-- KEYS[1] flashsale:lock:<name>        the lock (the same key lock_acquire.lua takes)
-- KEYS[2] flashsale:fence:<name>       highest fencing token this node has seen
-- KEYS[3] flashsale:fairq:<name>       the queue: waiter id scored by arrival
--                                      (µs since the epoch; ties by id)
-- KEYS[4] flashsale:fairq-exp:<name>   the same ids scored by when their entry
--                                      ends (ms, this node's clock)
-- ARGV[1] token of this grant attempt
-- ARGV[2] ttl in milliseconds
-- ARGV[3] "1" when this node is the only lock node (then the fencing token
--         is settled here, in the same step), else "0"
-- ARGV[4] with ARGV[3] = "1" the clock floor of the fencing token
--         (unix_ms * 1000); with "0" the token the client proposes, which
--         the counter is raised to with the grant when below it (as in
--         lock_acquire.lua); the reply's fence is then the counter before
-- ARGV[5] the waiter's id (unique per lock call)
-- ARGV[6] the waiter's arrival, µs since the epoch (the same on every node,
--         so every node orders the queue alike)
-- ARGV[7] the entry's lease in ms: a waiter refreshes it on every attempt,
--         at least every third of it; a waiter that died leaves the queue
--         when it ends, so nobody waits behind it for longer than that
--
-- Returns {granted, pttl, fence}, as lock_acquire.lua:
--   {1, ttl, "<fence>"}    taken; the caller's entry has left the queue
--   {0, pttl, "<fence>"}   someone holds it (pttl its remaining ms), or it is
--                          free but another live waiter arrived first (pttl -2)
-- An error reply (and no change) for arguments that are not numbers.
--
-- Invariant: a held lock is never overwritten (NX), and it is only taken by
-- the waiter with the smallest (arrival, id) among the entries still live.
-- The queue bookkeeping (dropping ended entries, refreshing the caller's) is
-- the input of the check, not a result of it: it is the same whatever the
-- answer.

local ttl, arrival, lease = tonumber(ARGV[2]), tonumber(ARGV[6]), tonumber(ARGV[7])
local floor = tonumber(ARGV[4])
if not ttl or not arrival or not lease or not floor or ttl < 1 or lease < 1
    or ttl ~= math.floor(ttl) or lease ~= math.floor(lease) then
  return redis.error_reply('ERR lock_fair_acquire: ttl, lease and ARGV[4] must be whole positive numbers, arrival a number')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
end
-- NX: a waiter keeps its first arrival, even if its entry lapsed meanwhile.
redis.call('ZADD', KEYS[3], 'NX', arrival, ARGV[5])
redis.call('ZADD', KEYS[4], now + lease, ARGV[5])
for _, k in ipairs({KEYS[3], KEYS[4]}) do
  if redis.call('PTTL', k) < lease then
    redis.call('PEXPIRE', k, lease)
  end
end

local fence = redis.call('GET', KEYS[2]) or '0'
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if head == ARGV[5] and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('ZREM', KEYS[4], ARGV[5])
  -- Tokens stay below 2^53, so Lua's numbers hold them exactly.
  if ARGV[3] == '1' then
    local next = math.max(tonumber(fence) + 1, tonumber(ARGV[4]))
    fence = string.format('%.0f', next)
    redis.call('SET', KEYS[2], fence)
  elseif tonumber(fence) < tonumber(ARGV[4]) then
    redis.call('SET', KEYS[2], ARGV[4])
  end
  return {1, ttl, fence}
end
return {0, redis.call('PTTL', KEYS[1]), fence}
