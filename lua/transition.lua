-- transition.lua: moves held orders of one bucket to their next state, each
-- one a compare-and-set on the order's state in the bucket's slot, appended
-- to the bucket's order stream in the same atomic step.
--
--   held --pay--> paid            held --cancel--> cancelled
--   held --expire (deadline passed)--> expired
--   expired / cancelled --pay, late_payment = "retake", a unit left--> paid
--     (only while the sale sells, and, under a per-user limit, only for an
--     order its buyer's home bucket served: the quota is counted again here)
--
-- Paid is final; cancelled and expired are final but for a retake. A
-- transition that already happened answers the same again (a retry), so
-- any number of callers and sweepers may run at once: the state decides,
-- and the units of an order go back at most once per hold.
--
-- The one clock is this master's TIME: a payment and the deadline race here
-- and nowhere else. A payment that arrives once the deadline has passed
-- finds the order still "held" if no sweeper came yet, and is refused all
-- the same (under "refuse" the order expires in that step); under "retake"
-- it keeps the unit it already has.
--
-- Units going back: the stock of this bucket, and the buyer's quota. The
-- quota lives in the buyer's home bucket. When that is this bucket, the
-- order hash names its quota key ("q", written by purchase.lua from its own
-- KEYS: the one key this script touches that is not in KEYS, always in
-- this slot) and it is given back here. When it is another bucket (another
-- slot), the order goes on KEYS[5], and the engine gives the quota back
-- there, once, and takes it off KEYS[5] (the sweeper finishes what a
-- crash left).
--
-- KEYS[1] {tag}:sale        hash: bucket, limit, late (late_payment: "refuse" or "retake"), tag,
--                           state, ends_ms
-- KEYS[2] {tag}:stock       integer, the units left in this bucket
-- KEYS[3] {tag}:orders      the order stream (transitions go on it too)
-- KEYS[4] {tag}:holds       sorted set of held orders (score: expires_ms)
-- KEYS[5] {tag}:owed        sorted set of orders whose quota is owed back to
--                           another bucket (score: ms)
-- then, for order i = 1..n:
-- KEYS[5+i] {tag}:o:<order_id>  the order's hash (see purchase.lua)
-- ARGV[1] "pay", "cancel" or "expire"
-- ARGV[2] seconds to keep a final order's hash (1..2^31)
-- ARGV[3] "1" when the engine will WAIT for a replica (ack = replicated)
-- then, for order i = 1..n:
-- ARGV[2+2i] the order id
-- ARGV[3+2i] the payment reference ("pay"; "" otherwise)
--
-- Returns one {code, state, expires_ms, units} per order, in the order sent;
-- state is the order's state after the call, units what this call gave back
-- to stock (a retake: minus what it took; 0 when it moved no stock):
--   { 1, state, expires_ms}   done now
--   { 2, state, expires_ms}   done before, by the same call (same payment ref)
--   { 3, "paid", expires_ms}  a late payment took a unit again (retake)
--   { 0, state, expires_ms}   expire: the order is not held (nothing to do)
--   {-1, "", 0}               no such order in this bucket
--   {-2, state, expires_ms}   pay: the hold expired or was cancelled; the unit was not kept
--   {-3, state, expires_ms}   cancel: the order is already final
--   {-4, "paid", expires_ms}  pay: paid before with another payment reference
--   {-5, "held", expires_ms}  expire: its deadline has not come yet
--   {-6, "", 0}               no such sale in this bucket
--   {-7, "", 0}               invalid argument
--
-- Invariants: a hold's units go back at most once (only the step that moves
-- it out of "held" gives them back, and only to "cancelled" or "expired");
-- a retake takes a unit only from stock there is; every check of an order
-- comes before its first write.

local n = (#ARGV - 3) / 2
if n < 1 or n ~= math.floor(n) or #KEYS ~= 5 + n then
  return redis.error_reply('ERR transition.lua: KEYS and ARGV do not describe whole orders')
end
local op = ARGV[1]
local ttl = tonumber(ARGV[2])
local replicated = ARGV[3] == '1'
local out = {}
local sale = redis.call('HMGET', KEYS[1], 'bucket', 'limit', 'late', 'tag', 'state', 'ends_ms')
if not sale[1] then
  for i = 1, n do
    out[i] = {-6, '', 0, 0}
  end
  return out
end
if (op ~= 'pay' and op ~= 'cancel' and op ~= 'expire')
   or not ttl or ttl < 1 or ttl > 2147483648 or ttl ~= math.floor(ttl) then
  for i = 1, n do
    out[i] = {-7, '', 0, 0}
  end
  return out
end
local bucket = sale[1]
local limit = tonumber(sale[2]) or 0
local retake = sale[3] == 'retake'
local ends_ms = tonumber(sale[6]) or 0
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- A retake is a new sale of the unit: only while the sale sells.
local selling = sale[5] == 'open' and (ends_ms == 0 or now_ms < ends_ms)

-- Writes the order's new state and version, and its event on the stream:
-- its qty and whether it took units (a retake) let reconcile count the
-- units of every order exactly (units out = orders - returned + retaken).
-- The event goes on the stream first: XADD is the write that can still fail
-- (a stream whose ids are exhausted, a key of another type), and a failed
-- one must leave nothing behind. So every step calls this before it gives
-- units back or takes them.
local function record(key, order_id, state, v, ref, qty, retake)
  redis.call('XADD', KEYS[3], '*', 'kind', state, 'order_id', order_id,
    'v', v, 'ts', now_ms, 'pay_ref', ref or '', 'qty', qty,
    'retake', retake and '1' or '0', 'tag', sale[4])
  redis.call('HSET', key, 'state', state, 'v', v, state .. '_ms', now_ms)
  if ref then
    redis.call('HSET', key, 'pay_ref', ref)
  end
  redis.call('PEXPIRE', key, ttl * 1000)
  redis.call('ZREM', KEYS[4], order_id)
end

-- The units of a hold go back on sale, and to the buyer's quota.
local function give_back(order_id, qty, q, home)
  redis.call('INCRBY', KEYS[2], qty)
  if q ~= '' then
    local used = tonumber(redis.call('GET', q) or '0') or 0
    if used > 0 then
      redis.call('DECRBY', q, math.min(qty, used))
    end
  elseif limit > 0 and home ~= bucket then
    redis.call('ZADD', KEYS[5], now_ms, order_id)
  end
end

local function step(key, order_id, ref)
  local o = redis.call('HMGET', key, 'state', 'qty', 'expires_ms', 'q', 'home', 'v', 'pay_ref')
  local state = o[1]
  if not state then
    -- A held order's record lives until the hold ends, so an index entry
    -- without one was evicted or deleted behind the engine's back: nothing
    -- can be given back by it, and a sweeper must not find it again.
    if op == 'expire' then
      redis.call('ZREM', KEYS[4], order_id)
    end
    return {-1, '', 0, 0}
  end
  local qty = tonumber(o[2])
  local expires_ms = tonumber(o[3])
  local v = tonumber(o[6])
  if not qty or not expires_ms or not v then
    -- A record this script never wrote: no sweeper should find it again.
    if op == 'expire' then
      redis.call('ZREM', KEYS[4], order_id)
    end
    return {-7, '', 0, 0}
  end
  local due = now_ms >= expires_ms
  if replicated then
    -- Every answer, a replay or a refusal included, rests on this order's
    -- state: a write (unchanged) makes this call propagate, so the WAIT the
    -- engine sends next covers whatever call set that state.
    redis.call('HSET', key, 'v', v)
  end

  if op == 'pay' then
    if ref == '' then
      return {-7, '', 0, 0}
    end
    if state == 'paid' then
      if o[7] ~= ref then
        return {-4, state, expires_ms, 0}
      end
      return {2, state, expires_ms, 0}
    end
    if state == 'held' and not due then
      record(key, order_id, 'paid', v + 1, ref, qty, false)
      return {1, 'paid', expires_ms, 0}
    end
    if state == 'held' and retake then
      -- Past the deadline, not yet swept: the unit is still this order's.
      record(key, order_id, 'paid', v + 1, ref, qty, false)
      return {3, 'paid', expires_ms, 0}
    end
    if state == 'held' then
      record(key, order_id, 'expired', v + 1, nil, qty, false)
      give_back(order_id, qty, o[4], o[5])
      return {-2, 'expired', expires_ms, qty}
    end
    local q = o[4]
    -- With a per-user limit, a retake must count its units against the
    -- buyer's quota again, and that quota lives in the buyer's home bucket:
    -- an order served by another bucket (q == "") cannot, in one atomic
    -- step, so it is refused (its quota already came back: counting it
    -- nowhere would let the buyer past the limit).
    if not retake or not selling or (limit > 0 and q == '') then
      return {-2, state, expires_ms, 0}
    end
    local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
    local used = (limit > 0) and tonumber(redis.call('GET', q) or '0') or 0
    if stock < qty or (limit > 0 and used + qty > limit) then
      return {-2, state, expires_ms, 0}
    end
    record(key, order_id, 'paid', v + 1, ref, qty, true)
    redis.call('DECRBY', KEYS[2], qty)
    if limit > 0 then
      redis.call('INCRBY', q, qty)
      if ends_ms > 0 then
        redis.call('PEXPIREAT', q, ends_ms + ttl * 1000)
      end
    end
    return {3, 'paid', expires_ms, -qty}
  end

  if op == 'cancel' then
    if state == 'cancelled' then
      return {2, state, expires_ms, 0}
    end
    if state ~= 'held' then
      return {-3, state, expires_ms, 0}
    end
    -- Past the deadline the hold is over whoever comes first: it expires.
    local to = due and 'expired' or 'cancelled'
    record(key, order_id, to, v + 1, nil, qty, false)
    give_back(order_id, qty, o[4], o[5])
    if due then
      return {-3, to, expires_ms, qty}
    end
    return {1, to, expires_ms, qty}
  end

  -- expire
  if state ~= 'held' then
    redis.call('ZREM', KEYS[4], order_id)
    return {0, state, expires_ms, 0}
  end
  if not due then
    return {-5, state, expires_ms, 0}
  end
  record(key, order_id, 'expired', v + 1, nil, qty, false)
  give_back(order_id, qty, o[4], o[5])
  return {1, 'expired', expires_ms, qty}
end

for i = 1, n do
  out[i] = step(KEYS[5 + i], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
return out
