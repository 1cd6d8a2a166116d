-- purchase.lua: a batch of purchases in one bucket, each one the whole
-- purchase, atomically, in its buyer's home bucket.
--
-- The engine queues the purchases whose home is this bucket while a call to
-- it is in flight and sends them as one call (natural batching: no timer, so
-- at low load a batch holds one purchase). Each purchase is decided on its
-- own, in order, exactly as if it were sent alone: its checks come before its
-- writes, a refused purchase changes nothing, and no purchase's answer
-- depends on another's except through the stock and quota they share. What
-- a batch shares is read once: the sale hash, TIME, and the stock (kept in a
-- local as it is taken, and written once, after the batch). The anchor of
-- the bench sends a batch of one.
--
-- The home bucket of a buyer is picked by the engine from the user id, so the
-- buyer's quota and every request record of that buyer live in one slot. When
-- the home bucket has the stock, this one script is the whole purchase. When it
-- has not (and the SKU has other buckets), the script reserves the quota, marks
-- the request pending (and indexes it, so a sweeper can settle it if the
-- process dies), and the engine walks the other buckets with take.lua, then
-- closes the request with settle.lua.
--
-- A request is (sku, user, request_id): its record key is named from all
-- three (the tag implies the sku), so another user's request id is another
-- request. Two attempts of one request in one batch: the first decides, the
-- second replays its answer.
--
-- KEYS[1] {tag}:sale         hash: sku, tag, bucket, buckets, state, starts_ms, ends_ms, limit,
--                            hold_ms (absent or 0: an order is paid at once)
-- KEYS[2] {tag}:stock        integer, the units left in this bucket
-- KEYS[3] {tag}:orders       stream the order writer drains into PostgreSQL; a new
--                            order is one field, its parts separated by spaces
--                            (which no sku, order id or user id holds; the sku and
--                            bucket are in the order id, the tag is the stream's;
--                            see engine/src/orders/entry.rs), ts the batch's TIME in ms:
--                            p "<qty> <ts> <order_id> <user>"               paid at once
--                            h "<qty> <ts> <expires_ms> <order_id> <user>"  held
-- KEYS[4] {tag}:pending      sorted set of pending requests (score: ms). The member
--                            is the record key without its "{tag}:r:" prefix,
--                            "<n>:<user>:<request_id>" (not sent: the hot path
--                            builds no string it rarely needs)
-- KEYS[5] {tag}:holds        sorted set of held orders (score: expires_ms), the
--                            sweeper's deadline index (sales with hold_ms > 0)
-- then, for purchase i = 1..n, s keys each (s = 3 when the sale holds
-- orders, hold_ms > 0; else 2):
-- KEYS[6+s(i-1)] {tag}:q:<user>  integer, units this user has bought, held or reserved
-- KEYS[7+s(i-1)] {tag}:r:<n>:<user>:<request_id>   request record, one of
--                              "C:<qty>:<bucket>:<order_id>"  confirmed
--                              "P:<qty>"                      pending (home was short)
--                              "S:<qty>:<code>"               every bucket refused (code -1/-4/-5)
-- KEYS[8+s(i-1)] {tag}:o:<order_id>  (s = 3 only) the order's hold, written when
--                              this purchase confirms: hash state "held", user,
--                              qty, home (this bucket), expires_ms, q (the quota
--                              key to give back, "" when the sale has no limit),
--                              v (1: the version the order writer orders by).
--                              No expiry while held (the hold must end by a
--                              transition, see transition.lua, which keeps it
--                              request_ttl after)
-- ARGV[1] seconds to keep request records (1..2^31)
-- ARGV[2] "1" when the engine will WAIT for a replica (ack = replicated)
-- ARGV[3] "compact": new orders go on KEYS[3] as one field (p or h, above);
--         "fields": a field per column (order_id, sku, user, qty, bucket, tag,
--         ts[, status "held", expires_ms]), the form order writers from
--         before the compact one read (config order_record, for upgrades)
-- then, for purchase i = 1..n:
-- ARGV[3i+1] qty (integer 1..2^53-1)
-- ARGV[3i+2] order id to use if this request makes a new order
-- ARGV[3i+3] user id
--
-- Returns one {code, order_id, n} per purchase, in the order sent:
--   { 1, order_id, bucket}   confirmed, new order queued on KEYS[3] (paid)
--   { 1, order_id, bucket, expires_ms}  the same, held until expires_ms (hold_ms > 0)
--   { 2, order_id, bucket}   this request was confirmed before: same answer
--   { 3, "", stock, since}   home bucket short: quota reserved, request pending, walk the
--                            others; since: the walk's start (ms, its pending score),
--                            which take.lua's walk limit counts from
--   { 4, "", stock, since}   this request is pending from an earlier attempt: walk the others
--   {-1, "", stock}          sold out (one-bucket sale, or every bucket refused this request)
--   {-2, "", used}           per-user limit would be exceeded
--   {-3, "", 0}              sale not started
--   {-4, "", 0}              sale ended
--   {-5, "", 0}              sale closed
--   {-6, "", 0}              no such sale in this bucket
--   {-7, "", 0}              invalid argument (qty or ttl)
--   {-8, "", 0}              this request was made before with another qty
-- A call whose KEYS and ARGV do not describe whole purchases is an error
-- reply, and changes nothing.
--
-- Invariants: stock never goes below zero; an order is queued in the same
-- atomic step that takes its stock; every check of a purchase comes before
-- its first write, so a refused purchase changes nothing; its first write is
-- the order's XADD, the one that can still fail, so a purchase whose order
-- the stream refuses changes nothing either.

local MAX = 9007199254740991
local n = (#ARGV - 3) / 3
local s = n >= 1 and (#KEYS - 5) / n or 0
if n < 1 or n ~= math.floor(n) or (s ~= 2 and s ~= 3) then
  return redis.error_reply('ERR purchase.lua: KEYS and ARGV do not describe whole purchases')
end
if ARGV[3] ~= 'compact' and ARGV[3] ~= 'fields' then
  return redis.error_reply('ERR purchase.lua: ARGV[3] must be compact or fields')
end
local compact = ARGV[3] == 'compact'
local out = {}
local sale = redis.call('HMGET', KEYS[1], 'state', 'starts_ms', 'ends_ms', 'limit', 'bucket', 'buckets', 'hold_ms', 'sku', 'tag')
local hold_ms = tonumber(sale[7] or '0') or 0
if sale[1] and (hold_ms > 0) ~= (s == 3) then
  return redis.error_reply('ERR purchase.lua: the order keys do not match the sale\'s hold_ms')
end
if not sale[1] then
  for i = 1, n do
    out[i] = {-6, '', 0}
  end
  return out
end
local ttl = tonumber(ARGV[1])
local ttl_ok = ttl and ttl >= 1 and ttl <= 2147483648 and ttl == math.floor(ttl)
local replicated = ARGV[2] == '1'
local open = sale[1] == 'open'
local starts_ms = tonumber(sale[2])
local ends_ms = tonumber(sale[3])
local limit = tonumber(sale[4])
local bucket = tonumber(sale[5])
local buckets = tonumber(sale[6])
-- "{tag}:pending" and "{tag}:r:<member>" share the "{tag}:" prefix.
local member_from = #KEYS[4] - #'pending' + #'r:' + 1

-- Read once per batch, on first need; the stock is then kept here as it is
-- taken, and written once at the end (see the loop at the bottom).
local stock, now_ms, now_text
local stock_taken = false
local function current_stock()
  if not stock then
    stock = tonumber(redis.call('GET', KEYS[2]) or '0')
  end
  return stock
end
local function clock_ms()
  if not now_ms then
    local now = redis.call('TIME')
    now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    now_text = string.format('%d', now_ms)
  end
  return now_ms
end

-- Counts qty against the buyer's limit. The quota lives as long as the
-- sale (plus the retry window after its end), never "per request_ttl of
-- inactivity".
local function take_quota(quota_key, qty)
  if limit > 0 then
    redis.call('INCRBY', quota_key, qty)
    if ends_ms > 0 then
      redis.call('PEXPIREAT', quota_key, ends_ms + ttl * 1000)
    end
  end
end

local function buy(quota_key, record_key, order_key, qty_arg, order_id, user)
  local qty = tonumber(qty_arg)
  if not ttl_ok or not qty or qty < 1 or qty > MAX or qty ~= math.floor(qty) then
    return {-7, '', 0}
  end

  -- A retried request gets its first answer, even after the sale closed.
  local prior = redis.call('GET', record_key)
  if prior then
    local kind, pqty, rest = string.match(prior, '^(%u):(%d+):?(.*)$')
    if tonumber(pqty) ~= qty then
      return {-8, '', 0}
    end
    if kind == 'C' then
      local served_by, prior_order = string.match(rest, '^(%d+):(.+)$')
      if replicated then
        -- Rewrite the record unchanged so this call propagates: the WAIT the
        -- engine sends next then covers the first attempt's writes too.
        redis.call('SET', record_key, prior, 'KEEPTTL')
      end
      return {2, prior_order, tonumber(served_by)}
    end
    if kind == 'P' then
      if replicated then
        -- The first attempt's reservation must be on a replica before this
        -- attempt walks: propagate, so the engine's WAIT covers it.
        redis.call('SET', record_key, prior, 'KEEPTTL')
      end
      -- The walk's limit counts from the first attempt's start (its
      -- pending score); a record whose score is gone (settled meanwhile)
      -- gets 0: a walk past its limit, which takes nowhere.
      local since = redis.call('ZSCORE', KEYS[4], string.sub(record_key, member_from))
      return {4, '', current_stock(), tonumber(since or '0') or 0}
    end
    return {tonumber(rest), '', current_stock()}
  end

  if not open then
    return {-5, '', 0}
  end
  local now = clock_ms()
  if now < starts_ms then
    return {-3, '', 0}
  end
  if ends_ms > 0 and now >= ends_ms then
    return {-4, '', 0}
  end
  if limit > 0 then
    local used = tonumber(redis.call('GET', quota_key) or '0')
    if used + qty > limit then
      return {-2, '', used}
    end
  end
  local have = current_stock()
  if have < qty and buckets <= 1 then
    return {-1, '', have}
  end

  -- Every check of this purchase is done; its writes follow. The order
  -- goes on the stream first: XADD is the write that can still fail (a
  -- stream whose ids are exhausted, a key of another type), and a failed
  -- one must leave nothing behind, not a confirmed record, a quota or a
  -- unit taken for an order that is not queued.
  if have >= qty then
    local expires_ms = now + hold_ms
    if hold_ms == 0 then
      if compact then
        redis.call('XADD', KEYS[3], '*', 'p', qty .. ' ' .. now_text .. ' ' .. order_id .. ' ' .. user)
      else
        redis.call('XADD', KEYS[3], '*', 'order_id', order_id, 'sku', sale[8], 'user', user,
          'qty', qty, 'bucket', sale[5], 'tag', sale[9], 'ts', now_text)
      end
    elseif compact then
      redis.call('XADD', KEYS[3], '*', 'h',
        qty .. ' ' .. now_text .. ' ' .. string.format('%d', expires_ms) .. ' ' .. order_id .. ' ' .. user)
    else
      redis.call('XADD', KEYS[3], '*', 'order_id', order_id, 'sku', sale[8], 'user', user,
        'qty', qty, 'bucket', sale[5], 'tag', sale[9], 'ts', now_text,
        'status', 'held', 'expires_ms', string.format('%d', expires_ms))
    end
    stock = have - qty
    stock_taken = true
    take_quota(quota_key, qty)
    if hold_ms > 0 then
      redis.call('HSET', order_key, 'state', 'held', 'user', user, 'qty', qty,
        'home', sale[5], 'expires_ms', expires_ms, 'q', limit > 0 and quota_key or '', 'v', 1)
      redis.call('ZADD', KEYS[5], expires_ms, order_id)
    end
    -- The answer is written last.
    redis.call('SET', record_key, 'C:' .. qty .. ':' .. sale[5] .. ':' .. order_id, 'EX', ttl)
    if hold_ms == 0 then
      return {1, order_id, bucket}
    end
    return {1, order_id, bucket, expires_ms}
  end

  -- Short here, but other buckets may have stock: the quota stays reserved in
  -- this slot while the engine looks elsewhere, so the limit holds across
  -- buckets. This bucket never takes for this request from now on.
  redis.call('ZADD', KEYS[4], now, string.sub(record_key, member_from))
  take_quota(quota_key, qty)
  redis.call('SET', record_key, 'P:' .. qty, 'EX', ttl)
  return {3, '', have, now}
end

-- The stock taken is written once, after the batch (a DECRBY per purchase
-- cost the master more than a tenth of a purchase). Redis keeps what a
-- script wrote before an error, so the loop runs under pcall: if a purchase
-- raises midway, the units the purchases before it took are still written
-- before the error goes back, and no order stands without its stock.
local ok, err = pcall(function()
  for i = 1, n do
    local k = 5 + s * (i - 1)
    out[i] = buy(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[3 * i + 1], ARGV[3 * i + 2], ARGV[3 * i + 3])
  end
end)
if stock_taken then
  redis.call('SET', KEYS[2], string.format('%d', stock))
end
if not ok then
  -- Sent back with its own code (WRONGTYPE, OOM, ...), as it would be
  -- without the pcall: a command's error reaches pcall as "CODE message",
  -- a Lua error as plain text (then ERR).
  if type(err) == 'table' then
    return err
  end
  err = tostring(err)
  return redis.error_reply(string.match(err, '^%u+ ') and err or 'ERR ' .. err)
end
return out
