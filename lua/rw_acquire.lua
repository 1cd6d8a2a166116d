-- rw_acquire.lua: take a read-write lock for reading or for writing on one
-- lock node, and report the node's fencing counter either way.
--
-- KEYS[1] flashsale:rw:<name>        the holders: field "r:<token>" per
--                                    reader, "w:<token>" for the writer,
--                                    each valued with when it ends (ms, this
--                                    node's clock)
-- KEYS[2] flashsale:rwq:<name>       writers waiting: id scored by when the
--                                    entry ends (ms, this node's clock)
-- KEYS[3] flashsale:rwfence:<name>   highest fencing token this node has seen
-- ARGV[1] token of this grant attempt
-- ARGV[2] ttl in milliseconds
-- ARGV[3] "1" when this node is the only lock node (the fencing token is then
--         settled here), else "0"
-- ARGV[4] with ARGV[3] = "1" the clock floor of the fencing token
--         (unix_ms * 1000); with "0" the token the client proposes, which
--         the counter is raised to with the grant when below it (as in
--         lock_acquire.lua); the reply's fence is then the counter before
-- ARGV[5] "r" to read, "w" to write
-- ARGV[6] the waiter's id (a writer that is refused queues under it)
-- ARGV[7] a waiting writer's entry lease in ms (refreshed on every attempt)
-- ARGV[8] the caller's own write token, or "": a writer taking the read lock
--         (a downgrade) is let in past itself and past waiting writers
--
-- Returns {granted, pttl, fence}, as lock_acquire.lua; pttl is, when refused,
-- for a writer the ms until the first holder's lease ends, for a reader the
-- ms until the writer's lease ends (-2 when only waiting writers keep it out).
-- An error reply (and no change) for bad arguments.
--
-- Invariant: a writer holds alone; readers hold together; while a writer
-- waits (a live entry in KEYS[2]) no new reader gets in, so writers are not
-- starved by a stream of readers. Ended holders and entries are dropped
-- first: that is the input of the check, the same whatever the answer.

local ttl, lease, mode = tonumber(ARGV[2]), tonumber(ARGV[7]), ARGV[5]
local floor = tonumber(ARGV[4])
if not ttl or not lease or not floor or ttl < 1 or lease < 1
    or ttl ~= math.floor(ttl) or lease ~= math.floor(lease)
    or (mode ~= 'r' and mode ~= 'w') then
  return redis.error_reply('ERR rw_acquire: ttl, lease and ARGV[4] must be whole positive numbers, mode r or w')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local writer, writer_ends, readers, soonest = nil, nil, 0, nil
local holders = redis.call('HGETALL', KEYS[1])
for i = 1, #holders, 2 do
  local field, ends = holders[i], tonumber(holders[i + 1])
  if not ends or ends <= now then
    redis.call('HDEL', KEYS[1], field)
  else
    if string.sub(field, 1, 2) == 'w:' then
      writer, writer_ends = string.sub(field, 3), ends
    else
      readers = readers + 1
    end
    if not soonest or ends < soonest then
      soonest = ends
    end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)

local fence = redis.call('GET', KEYS[3]) or '0'
local ok
if mode == 'r' then
  local downgrade = ARGV[8] ~= '' and writer == ARGV[8]
  ok = downgrade or (not writer and redis.call('ZCARD', KEYS[2]) == 0)
else
  ok = not writer and readers == 0
end
if not ok then
  if mode == 'w' then
    redis.call('ZADD', KEYS[2], now + lease, ARGV[6])
    if redis.call('PTTL', KEYS[2]) < lease then
      redis.call('PEXPIRE', KEYS[2], lease)
    end
  end
  -- A reader waits for the writer that holds, else only for the waiting
  -- writers (-2: they hold nothing yet, and may give up or die at any time,
  -- so the reader looks again soon rather than after other readers' leases).
  if mode == 'r' then
    return {0, writer_ends and (writer_ends - now) or -2, fence}
  end
  return {0, soonest and (soonest - now) or -2, fence}
end

if mode == 'w' then
  redis.call('ZREM', KEYS[2], ARGV[6])
end
redis.call('HSET', KEYS[1], mode .. ':' .. ARGV[1], now + ttl)
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
-- Tokens stay below 2^53, so Lua's numbers hold them exactly.
if ARGV[3] == '1' then
  local next = math.max(tonumber(fence) + 1, tonumber(ARGV[4]))
  fence = string.format('%.0f', next)
  redis.call('SET', KEYS[3], fence)
elseif tonumber(fence) < tonumber(ARGV[4]) then
  redis.call('SET', KEYS[3], ARGV[4])
end
return {1, ttl, fence}
