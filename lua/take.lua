-- take.lua: one step of a fall-through walk. Takes stock for a pending
-- request in a bucket other than the buyer's home bucket, or records that
-- this bucket refused it. Either outcome is final for the request here.
--
-- Why a refusal is recorded: the engine walks the other buckets in one fixed
-- order and stops at the first that takes. If a refusal were forgotten, a
-- retry after a restock could take in a bucket an earlier attempt passed,
-- while that attempt took further on: two orders for one request. With every
-- outcome final per bucket, a bucket takes only when each bucket before it
-- refused for good, so at most one bucket ever takes for a request, however
-- many attempts (and sweepers) walk at once.
--
-- KEYS[1] {tag}:sale         hash: bucket, state, starts_ms, ends_ms, hold_ms
-- KEYS[2] {tag}:stock        integer, the units left in this bucket
-- KEYS[3] {tag}:orders       stream the order writer drains into PostgreSQL (a new
--                            order is one field, p or h, as purchase.lua writes it)
-- KEYS[4] {tag}:r:<n>:<user>:<request_id>   this request's record in this bucket:
--                              "C:<qty>:<bucket>:<order_id>" took here
--                              "X:<qty>:<code>"              refused here (code -1/-4/-5)
-- KEYS[5] {tag}:holds        sorted set of held orders (score: expires_ms)
-- KEYS[6] {tag}:o:<order_id> only when the sale holds orders (hold_ms > 0): the
--                            order's hold, written when this bucket takes (see
--                            purchase.lua; q is "": the buyer's quota lives in
--                            the home bucket, another slot)
-- ARGV[1] qty (integer 1..2^53-1)
-- ARGV[2] order id to use if this request makes a new order
-- ARGV[3] user id
-- ARGV[4] seconds to keep the request record (1..2^31)
-- ARGV[5] "take"; "refuse" (the sweeper closing an abandoned request: never
--         takes, only makes the refusal final where nothing was decided); or
--         "confirm" (a replay checking the order it names is still here:
--         never takes, never refuses)
-- ARGV[6] "1" when the engine will WAIT for a replica (ack = replicated)
-- ARGV[7] the buyer's home bucket (its index), kept on a held order so its
--         quota can be given back there
-- ARGV[8] "compact" or "fields": the form of the new order's stream entry
--         (see purchase.lua's ARGV[3])
-- ARGV[9] when the request's walk began: its score in the home bucket's
--         pending set (ms, the home master's clock); "0" for "confirm", or
--         when the start is unknown (then a refusal is kept request_ttl)
-- ARGV[10] the walk limit, ms (the engine's pending_timeout, >= 1): no take
--         after since + limit, on this master's clock
--
-- Returns {code, order_id, n}:
--   { 1, order_id, bucket}   taken, new order queued on KEYS[3] (paid)
--   { 1, order_id, bucket, expires_ms}  the same, held until expires_ms (hold_ms > 0)
--   { 2, order_id, bucket}   this request took here before: same answer
--   {-1, "", stock}          refused: not enough stock (or the sweeper's refusal, or the
--                            walk is past its limit)
--   {-4, "", stock}          refused: the sale's window is over (or not open)
--   {-5, "", stock}          refused: sale closed
--   {-6, "", 0}              no such sale in this bucket
--   {-7, "", 0}              invalid argument
--   {-8, "", 0}              this request was made before with another qty
--   {-9, "", 0}              "confirm": this bucket holds no record of the request
--
-- Invariant: a request takes stock in a bucket at most once, and in at most
-- one bucket of its sale.
--
-- Why a refusal is kept only until since + 2 * limit, not request_ttl (a day):
-- a refused multi-bucket request left a record in every bucket for a day,
-- and needs no authentication, so a flood of them filled Redis. A refusal
-- must stand only while an attempt of the request could still take here,
-- and no take happens once this master's clock is past since + limit: the
-- record's expiry and that check read the same clock against the same
-- since, whatever the skew between masters. The second limit covers this
-- clock stepping back by as much. The home bucket's record, which answers
-- every retry, keeps request_ttl.

local MAX = 9007199254740991
local sale = redis.call('HMGET', KEYS[1], 'state', 'bucket', 'starts_ms', 'ends_ms', 'hold_ms', 'sku', 'tag')
if not sale[1] then
  return {-6, '', 0}
end
local hold_ms = tonumber(sale[5] or '0') or 0
if (hold_ms > 0) ~= (#KEYS == 6) or #KEYS < 5 then
  return redis.error_reply('ERR take.lua: the order key does not match the sale\'s hold_ms')
end
local qty = tonumber(ARGV[1])
local ttl = tonumber(ARGV[4])
if not qty or qty < 1 or qty > MAX or qty ~= math.floor(qty)
   or not ttl or ttl < 1 or ttl > 2147483648 or ttl ~= math.floor(ttl)
   or (ARGV[5] ~= 'take' and ARGV[5] ~= 'refuse' and ARGV[5] ~= 'confirm')
   or (ARGV[8] ~= 'compact' and ARGV[8] ~= 'fields')
   or (hold_ms > 0 and not tonumber(ARGV[7] or '')) then
  return {-7, '', 0}
end
local since_ms = tonumber(ARGV[9] or '')
local walk_ms = tonumber(ARGV[10] or '')
if not since_ms or since_ms < 0 or since_ms > MAX or since_ms ~= math.floor(since_ms)
   or not walk_ms or walk_ms < 1 or walk_ms > 2147483648 or walk_ms ~= math.floor(walk_ms) then
  return {-7, '', 0}
end
local prior = redis.call('GET', KEYS[4])
if prior then
  local kind, pqty, rest = string.match(prior, '^(%u):(%d+):(.*)$')
  if tonumber(pqty) ~= qty then
    return {-8, '', 0}
  end
  if kind == 'C' then
    local bucket, order_id = string.match(rest, '^(%d+):(.+)$')
    if ARGV[6] == '1' then
      redis.call('SET', KEYS[4], prior, 'KEEPTTL')
    end
    return {2, order_id, tonumber(bucket)}
  end
  if ARGV[6] == '1' then
    redis.call('SET', KEYS[4], prior, 'KEEPTTL')
  end
  return {tonumber(rest), '', tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if ARGV[5] == 'confirm' then
  return {-9, '', 0}
end

local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ends_ms = tonumber(sale[4])
local refusal = nil
if sale[1] ~= 'open' then
  refusal = -5
elseif now_ms < tonumber(sale[3]) or (ends_ms > 0 and now_ms >= ends_ms) then
  refusal = -4
elseif ARGV[5] == 'refuse' or stock < qty or now_ms >= since_ms + walk_ms then
  refusal = -1
end
if refusal then
  -- Kept until since + 2 * limit, and always for at least one limit: under
  -- ack = replicated the engine waits for a replica to hold the refusal, so
  -- there must be one. A start of 0 is a start unknown (the request's
  -- pending entry is gone): another attempt may still be walking with the
  -- real one, so the refusal is kept as long as the request, as before the
  -- limit, for that attempt to find.
  local keep_ms = ttl * 1000
  if since_ms > 0 then
    keep_ms = math.min(math.max(since_ms + 2 * walk_ms - now_ms, walk_ms), keep_ms)
  end
  redis.call('SET', KEYS[4], 'X:' .. qty .. ':' .. refusal, 'PX', keep_ms)
  return {refusal, '', stock}
end

-- The order goes on the stream first: XADD is the write that can still fail
-- (a stream whose ids are exhausted, a key of another type), and a failed
-- one must leave nothing behind. The record, the answer, is written last.
local expires_ms = now_ms + hold_ms
if ARGV[8] == 'fields' then
  if hold_ms == 0 then
    redis.call('XADD', KEYS[3], '*', 'order_id', ARGV[2], 'sku', sale[6], 'user', ARGV[3],
      'qty', qty, 'bucket', sale[2], 'tag', sale[7], 'ts', string.format('%d', now_ms))
  else
    redis.call('XADD', KEYS[3], '*', 'order_id', ARGV[2], 'sku', sale[6], 'user', ARGV[3],
      'qty', qty, 'bucket', sale[2], 'tag', sale[7], 'ts', string.format('%d', now_ms),
      'status', 'held', 'expires_ms', string.format('%d', expires_ms))
  end
elseif hold_ms == 0 then
  redis.call('XADD', KEYS[3], '*', 'p', qty .. ' ' .. string.format('%d', now_ms) .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
else
  redis.call('XADD', KEYS[3], '*', 'h',
    qty .. ' ' .. string.format('%d', now_ms) .. ' ' .. string.format('%d', expires_ms) .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
end
redis.call('DECRBY', KEYS[2], qty)
if hold_ms > 0 then
  redis.call('HSET', KEYS[6], 'state', 'held', 'user', ARGV[3], 'qty', qty,
    'home', ARGV[7], 'expires_ms', expires_ms, 'q', '', 'v', 1)
  redis.call('ZADD', KEYS[5], expires_ms, ARGV[2])
end
redis.call('SET', KEYS[4], 'C:' .. qty .. ':' .. sale[2] .. ':' .. ARGV[2], 'EX', ttl)
if hold_ms == 0 then
  return {1, ARGV[2], tonumber(sale[2])}
end
return {1, ARGV[2], tonumber(sale[2]), expires_ms}
