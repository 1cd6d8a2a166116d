-- purchase.lua: the whole purchase, atomically, in the buyer's home bucket.
--
-- The home bucket of a buyer is picked by the engine from the user id, so the
-- buyer's quota and every request record of that buyer live in one slot. When
-- the home bucket has the stock, this one script is the whole purchase. When it
-- has not (and the SKU has other buckets), the script reserves the quota, marks
-- the request pending (and indexes it, so a sweeper can settle it if the
-- process dies), and the engine walks the other buckets with take.lua, then
-- closes the request with settle.lua.
--
-- A request is (sku, user, request_id): KEYS[5] is named from all three (the
-- tag implies the sku), so another user's request id is another request.
--
-- KEYS[1] {tag}:sale         hash: sku, tag, bucket, buckets, state, starts_ms, ends_ms, limit
-- KEYS[2] {tag}:stock        integer, the units left in this bucket
-- KEYS[3] {tag}:orders       stream the order writer drains into PostgreSQL
-- KEYS[4] {tag}:q:<user>     integer, units this user has bought or reserved
-- KEYS[5] {tag}:r:<n>:<user>:<request_id>   request record, one of
--                              "C:<qty>:<bucket>:<order_id>"  confirmed
--                              "P:<qty>"                      pending (home was short)
--                              "S:<qty>:<code>"               every bucket refused (code -1/-4/-5)
-- KEYS[6] {tag}:pending      sorted set of pending requests (score: ms). The member
--                            is KEYS[5] without its "{tag}:r:" prefix,
--                            "<n>:<user>:<request_id>" (not sent: the hot path
--                            builds no string it rarely needs)
-- ARGV[1] qty (integer 1..2^53-1)
-- ARGV[2] order id to use if this request makes a new order
-- ARGV[3] user id
-- ARGV[4] seconds to keep request records (1..2^31)
-- ARGV[5] "1" when the engine will WAIT for a replica (ack = replicated)
--
-- Returns {code, order_id, n}:
--   { 1, order_id, bucket}   confirmed, new order queued on KEYS[3]
--   { 2, order_id, bucket}   this request was confirmed before: same answer
--   { 3, "", stock}          home bucket short: quota reserved, request pending, walk the others
--   { 4, "", stock}          this request is pending from an earlier attempt: walk the others
--   {-1, "", stock}          sold out (one-bucket sale, or every bucket refused this request)
--   {-2, "", used}           per-user limit would be exceeded
--   {-3, "", 0}              sale not started
--   {-4, "", 0}              sale ended
--   {-5, "", 0}              sale closed
--   {-6, "", 0}              no such sale in this bucket
--   {-7, "", 0}              invalid argument (qty or ttl)
--   {-8, "", 0}              this request was made before with another qty
--
-- Invariants: stock never goes below zero; an order is queued in the same
-- atomic step that takes its stock; every check comes before the first write,
-- so a refused call changes nothing.

local MAX = 9007199254740991
local sale = redis.call('HMGET', KEYS[1], 'state', 'starts_ms', 'ends_ms', 'limit', 'bucket', 'buckets', 'sku', 'tag')
if not sale[1] then
  return {-6, '', 0}
end
local qty = tonumber(ARGV[1])
local ttl = tonumber(ARGV[4])
if not qty or qty < 1 or qty > MAX or qty ~= math.floor(qty)
   or not ttl or ttl < 1 or ttl > 2147483648 or ttl ~= math.floor(ttl) then
  return {-7, '', 0}
end

-- A retried request gets its first answer, even after the sale closed.
local prior = redis.call('GET', KEYS[5])
if prior then
  local kind, pqty, rest = string.match(prior, '^(%u):(%d+):?(.*)$')
  if tonumber(pqty) ~= qty then
    return {-8, '', 0}
  end
  if kind == 'C' then
    local bucket, order_id = string.match(rest, '^(%d+):(.+)$')
    if ARGV[5] == '1' then
      -- Rewrite the record unchanged so this call propagates: the WAIT the
      -- engine sends next then covers the first attempt's writes too.
      redis.call('SET', KEYS[5], prior, 'KEEPTTL')
    end
    return {2, order_id, tonumber(bucket)}
  end
  local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
  if kind == 'P' then
    if ARGV[5] == '1' then
      -- The first attempt's reservation must be on a replica before this
      -- attempt walks: propagate, so the engine's WAIT covers it.
      redis.call('SET', KEYS[5], prior, 'KEEPTTL')
    end
    return {4, '', stock}
  end
  return {tonumber(rest), '', stock}
end

if sale[1] ~= 'open' then
  return {-5, '', 0}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if now_ms < tonumber(sale[2]) then
  return {-3, '', 0}
end
local ends_ms = tonumber(sale[3])
if ends_ms > 0 and now_ms >= ends_ms then
  return {-4, '', 0}
end

local limit = tonumber(sale[4])
if limit > 0 then
  local used = tonumber(redis.call('GET', KEYS[4]) or '0')
  if used + qty > limit then
    return {-2, '', used}
  end
end

local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
local buckets = tonumber(sale[6])
if stock < qty and buckets <= 1 then
  return {-1, '', stock}
end

-- Every check is done; the writes follow.
if limit > 0 then
  -- The quota lives as long as the sale (plus the retry window after its
  -- end), never "per request_ttl of inactivity".
  redis.call('INCRBY', KEYS[4], qty)
  if ends_ms > 0 then
    redis.call('PEXPIREAT', KEYS[4], ends_ms + ttl * 1000)
  end
end
if stock >= qty then
  redis.call('DECRBY', KEYS[2], qty)
  redis.call('XADD', KEYS[3], '*',
    'order_id', ARGV[2], 'sku', sale[7], 'user', ARGV[3], 'qty', qty,
    'bucket', sale[5], 'tag', sale[8], 'ts', now_ms)
  redis.call('SET', KEYS[5], 'C:' .. qty .. ':' .. sale[5] .. ':' .. ARGV[2], 'EX', ttl)
  return {1, ARGV[2], tonumber(sale[5])}
end

-- Short here, but other buckets may have stock: the quota stays reserved in
-- this slot while the engine looks elsewhere, so the limit holds across
-- buckets. This bucket never takes for this request from now on.
redis.call('SET', KEYS[5], 'P:' .. qty, 'EX', ttl)
-- "{tag}:pending" and "{tag}:r:<member>" share the "{tag}:" prefix.
local prefix = #KEYS[6] - #'pending'
redis.call('ZADD', KEYS[6], now_ms, string.sub(KEYS[5], prefix + #'r:' + 1))
return {3, '', stock}
