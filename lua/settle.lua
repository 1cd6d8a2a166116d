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
--
-- Returns {code, record}:
--   {1, record}   this call settled the request; record is what it wrote
--   {0, record}   it was not pending (settled before); record as it is now
--
-- A missing record (expired, or lost with a failover of this bucket's
-- master under ack = leader) is written from the outcome, so a later retry
-- replays it instead of buying again; for "C" the quota is counted again,
-- since its reservation was lost with the record.
--
-- Invariant: the reserved quota is given back at most once, only when no
-- bucket took stock for the request, and by the qty the request was made
-- with (the record's, never the caller's).

local ttl = tonumber(ARGV[5])
if not ttl or ttl < 1 or ttl > 2147483648 or (ARGV[1] ~= 'C' and ARGV[1] ~= 'S') then
  return redis.error_reply('ERR settle.lua: bad arguments')
end
local rec = redis.call('GET', KEYS[2])
local qty = rec and string.match(rec, '^P:(%d+)$')
if rec and not qty then
  redis.call('ZREM', KEYS[3], ARGV[6])
  return {0, rec}
end
local out
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
  redis.call('SET', KEYS[2], out, 'EX', ttl)
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
redis.call('SET', KEYS[2], out, 'EX', ttl)
redis.call('ZREM', KEYS[3], ARGV[6])
return {1, out}
