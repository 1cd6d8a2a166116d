-- settle.lua: close a pending request in the buyer's home bucket, once a walk
-- over the other buckets (take.lua) has an outcome. Run by the buyer's
-- attempt, by a concurrent retry, or by the sweeper: the first one settles,
-- the others read what it decided.
--
-- KEYS[1] {tag}:q:<user>     integer, units this user has bought or reserved
-- KEYS[2] {tag}:r:<n>:<user>:<request_id>   request record ("P:<qty>" while pending)
-- KEYS[3] {tag}:pending      sorted set of pending requests
-- ARGV[1] outcome: "C" (a bucket took) or "S" (every bucket refused)
-- ARGV[2] bucket that took (outcome "C")
-- ARGV[3] order id that took (outcome "C")
-- ARGV[4] refusal code (outcome "S": -1 sold out, -4 ended, -5 closed)
-- ARGV[5] seconds to keep the request record (1..2^31)
-- ARGV[6] the request's member in KEYS[3]
-- ARGV[7] qty of the request (used only when the record is missing)
-- ARGV[8] when the walk began: the request's score in KEYS[3] as the walk
--         read it (ms, this master's clock); "0" when unknown
-- ARGV[9] the walk limit, ms (the engine's pending_timeout, >= 1)
--
-- Returns {code, record}:
--   {1, record}   this call settled the request; record is what it wrote
--   {0, record}   it was not pending (settled before); record as it is now
--   {2, record}   the request is pending on a newer walk (another start in
--                 KEYS[3]): this walk is stale and settles nothing
--
-- Why an all-refused record ("S") lives only until since + 2 * limit (at
-- least one limit), not ARGV[5]: a flood of refused multi-bucket requests,
-- which needs no authentication, kept one such record per request for a
-- day. It must stand only while an attempt of the request could still
-- take: no bucket takes for a walk past since + limit (take.lua), and a
-- walk that refused everywhere saw every bucket refuse for good until
-- since + 2 * limit, so no attempt with this start ever takes after it.
-- Once the record is gone a retry is a new request with a new start, as a
-- one-bucket sale's sold-out always is; a walk of the old start still
-- running settles nothing then (code 2), so it cannot close the new one.
-- With the start unknown (0) the record keeps ARGV[5], as its refusals do.
--
-- A missing record (expired, or lost with a failover of this bucket's
-- master under ack = leader) is written from the outcome, so a later retry
-- replays it instead of buying again; for "C" the quota is counted again,
-- since its reservation was lost with the record.
--
-- Invariant: the reserved quota is given back at most once, only when no
-- bucket took stock for the request, and by the qty the request was made
-- with (the record's, never the caller's).

local MAX = 9007199254740991
local ttl = tonumber(ARGV[5])
local since_ms = tonumber(ARGV[8] or '')
local walk_ms = tonumber(ARGV[9] or '')
if not ttl or ttl < 1 or ttl > 2147483648 or (ARGV[1] ~= 'C' and ARGV[1] ~= 'S')
   or not since_ms or since_ms < 0 or since_ms > MAX or since_ms ~= math.floor(since_ms)
   or not walk_ms or walk_ms < 1 or walk_ms > 2147483648 or walk_ms ~= math.floor(walk_ms) then
  return redis.error_reply('ERR settle.lua: bad arguments')
end
local rec = redis.call('GET', KEYS[2])
local qty = rec and string.match(rec, '^P:(%d+)$')
if rec and not qty then
  redis.call('ZREM', KEYS[3], ARGV[6])
  return {0, rec}
end
if rec and since_ms > 0 then
  -- A pending entry lost (an eviction) reads as no score: settled as
  -- before, since no newer walk can be told from it.
  local score = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[6]) or '')
  if score and score ~= since_ms then
    return {2, rec}
  end
end
local out
local keep_ms = ttl * 1000
if ARGV[1] == 'S' and since_ms > 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  keep_ms = math.min(math.max(since_ms + 2 * walk_ms - now_ms, walk_ms), keep_ms)
end
if not rec then
  local q = tonumber(ARGV[7])
  if not q or q < 1 or q ~= math.floor(q) then
    return redis.error_reply('ERR settle.lua: bad qty')
  end
  if ARGV[1] == 'C' then
    out = 'C:' .. q .. ':' .. ARGV[2] .. ':' .. ARGV[3]
    redis.call('INCRBY', KEYS[1], q)
  else
    out = 'S:' .. q .. ':' .. ARGV[4]
  end
  redis.call('SET', KEYS[2], out, 'PX', keep_ms)
  redis.call('ZREM', KEYS[3], ARGV[6])
  return {1, out}
end
if ARGV[1] == 'C' then
  out = 'C:' .. qty .. ':' .. ARGV[2] .. ':' .. ARGV[3]
else
  out = 'S:' .. qty .. ':' .. ARGV[4]
  if redis.call('EXISTS', KEYS[1]) == 1 then
    if redis.call('DECRBY', KEYS[1], tonumber(qty)) <= 0 then
      redis.call('DEL', KEYS[1])
    end
  end
end
redis.call('SET', KEYS[2], out, 'PX', keep_ms)
redis.call('ZREM', KEYS[3], ARGV[6])
return {1, out}
