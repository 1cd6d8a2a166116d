-- take.lua: take stock for a pending request from a bucket other than the
-- buyer's home bucket (purchase.lua already checked window and quota there).
--
-- KEYS[1] {tag}:sale         hash: sku, tag, bucket, state
-- KEYS[2] {tag}:stock        integer, the units left in this bucket
-- KEYS[3] {tag}:orders       stream the order writer drains into PostgreSQL
-- KEYS[4] {tag}:r:<request>  record of this request in this bucket: "C:<bucket>:<order_id>"
-- ARGV[1] qty (integer >= 1)
-- ARGV[2] order id to use if this request makes a new order
-- ARGV[3] user id
-- ARGV[4] seconds to keep the request record
--
-- Returns {code, order_id, n}:
--   { 1, order_id, bucket}   taken, new order queued on KEYS[3]
--   { 2, order_id, bucket}   this request already took stock here: same answer
--   {-1, "", remaining}      not enough stock in this bucket
--   {-5, "", 0}              sale closed
--   {-6, "", 0}              no such sale in this bucket
--   {-7, "", 0}              invalid qty
--
-- Invariant: a request takes stock in a bucket at most once (the request
-- record), so a retry after a timeout never makes a second order.

local sale = redis.call('HMGET', KEYS[1], 'state', 'bucket', 'sku', 'tag')
if not sale[1] then
  return {-6, '', 0}
end
local qty = tonumber(ARGV[1])
if not qty or qty < 1 or qty ~= math.floor(qty) then
  return {-7, '', 0}
end
local prior = redis.call('GET', KEYS[4])
if prior then
  local bucket, order_id = string.match(prior, '^C:(%d+):(.+)$')
  return {2, order_id, tonumber(bucket)}
end
if sale[1] ~= 'open' then
  return {-5, '', 0}
end
local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
if stock < qty then
  return {-1, '', stock}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('DECRBY', KEYS[2], qty)
redis.call('XADD', KEYS[3], '*',
  'order_id', ARGV[2], 'sku', sale[3], 'user', ARGV[3], 'qty', qty,
  'bucket', sale[2], 'tag', sale[4], 'ts', now_ms)
redis.call('SET', KEYS[4], 'C:' .. sale[2] .. ':' .. ARGV[2], 'EX', tonumber(ARGV[4]))
return {1, ARGV[2], tonumber(sale[2])}
