-- purchase.lua: the whole purchase, atomically, in the buyer's home bucket.
--
-- The home bucket of a buyer is picked by the engine from the user id, so the
-- buyer's quota and every request record of that buyer live in one slot. When
-- the home bucket has the stock, this one script is the whole purchase. When it
-- has not (and the SKU has other buckets), the script reserves the quota, marks
-- the request pending and the engine goes on with take.lua and settle.lua.
--
-- KEYS[1] {tag}:sale         hash: sku, tag, bucket, buckets, state, starts_ms, ends_ms, limit
-- KEYS[2] {tag}:stock        integer, the units left in this bucket
-- KEYS[3] {tag}:orders       stream the order writer drains into PostgreSQL
-- KEYS[4] {tag}:q:<user>     integer, units this user has bought or reserved
-- KEYS[5] {tag}:r:<request>  request record: "P" (pending) or "C:<bucket>:<order_id>"
-- ARGV[1] qty (integer >= 1)
-- ARGV[2] order id to use if this request makes a new order
-- ARGV[3] user id
-- ARGV[4] seconds to keep quota and request records
--
-- Returns {code, order_id, n}:
--   { 1, order_id, bucket}   confirmed, new order queued on KEYS[3]
--   { 2, order_id, bucket}   this request_id was confirmed before: same answer
--   { 3, "", 0}              home bucket short: quota reserved, request pending, try the others
--   { 4, "", 0}              this request_id is pending from an earlier attempt: finish it
--   {-1, "", remaining}      sold out (one-bucket sale; remaining < qty)
--   {-2, "", used}           per-user limit would be exceeded
--   {-3, "", 0}              sale not started
--   {-4, "", 0}              sale ended
--   {-5, "", 0}              sale closed
--   {-6, "", 0}              no such sale in this bucket
--   {-7, "", 0}              invalid qty
--
-- Invariant: stock never goes below zero, and an order is queued in the same
-- atomic step that takes its stock, so no unit is ever sold without its order.

local sale = redis.call('HMGET', KEYS[1], 'state', 'starts_ms', 'ends_ms', 'limit', 'bucket', 'buckets', 'sku', 'tag')
if not sale[1] then
  return {-6, '', 0}
end
local qty = tonumber(ARGV[1])
if not qty or qty < 1 or qty ~= math.floor(qty) then
  return {-7, '', 0}
end

-- A retried request gets its first answer, even after the sale closed.
local prior = redis.call('GET', KEYS[5])
if prior then
  if prior == 'P' then
    return {4, '', 0}
  end
  local bucket, order_id = string.match(prior, '^C:(%d+):(.+)$')
  return {2, order_id, tonumber(bucket)}
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
local ttl = tonumber(ARGV[4])
if limit > 0 then
  local used = tonumber(redis.call('GET', KEYS[4]) or '0')
  if used + qty > limit then
    return {-2, '', used}
  end
end

local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
if stock >= qty then
  redis.call('DECRBY', KEYS[2], qty)
  redis.call('XADD', KEYS[3], '*',
    'order_id', ARGV[2], 'sku', sale[7], 'user', ARGV[3], 'qty', qty,
    'bucket', sale[5], 'tag', sale[8], 'ts', now_ms)
  if limit > 0 then
    redis.call('INCRBY', KEYS[4], qty)
    redis.call('EXPIRE', KEYS[4], ttl)
  end
  redis.call('SET', KEYS[5], 'C:' .. sale[5] .. ':' .. ARGV[2], 'EX', ttl)
  return {1, ARGV[2], tonumber(sale[5])}
end

if tonumber(sale[6]) <= 1 then
  return {-1, '', stock}
end

-- Short here, but other buckets may have stock: hold the quota in this slot
-- while the engine looks elsewhere, so the limit holds across buckets.
if limit > 0 then
  redis.call('INCRBY', KEYS[4], qty)
  redis.call('EXPIRE', KEYS[4], ttl)
end
redis.call('SET', KEYS[5], 'P', 'EX', ttl)
return {3, '', stock}
