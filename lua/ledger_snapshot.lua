-- ledger_snapshot.lua: one bucket's side of the ledger at one instant, for
-- reconcile. Read-only.
--
-- KEYS[1] {tag}:sale     hash; field "initial" = every unit ever put in
-- KEYS[2] {tag}:stock    integer, units left
-- KEYS[3] {tag}:orders   the bucket's order stream
--
-- Returns {initial, stock, last_id, entries}:
--   initial, stock   integers (0 when missing)
--   last_id          the stream's last generated id ("0-0" when none): every
--                    order this bucket ever made has an id <= last_id, even
--                    the ones the writer already trimmed
--   entries          flat array: order_id, qty, order_id, qty, ... of the
--                    entries still in the stream (malformed ones skipped)
--
-- Invariant: all four come from one atomic read, so
-- initial = stock + (orders with id <= last_id) holds exactly in it.

local initial = tonumber(redis.call('HGET', KEYS[1], 'initial') or '0')
local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
local last_id = '0-0'
local ok, info = pcall(redis.call, 'XINFO', 'STREAM', KEYS[3])
if ok then
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      last_id = info[i + 1]
    end
  end
end
local out = {}
if ok then
  for _, e in ipairs(redis.call('XRANGE', KEYS[3], '-', '+')) do
    local f = e[2]
    local order_id, qty
    for i = 1, #f, 2 do
      if f[i] == 'order_id' then order_id = f[i + 1] end
      if f[i] == 'qty' then qty = tonumber(f[i + 1]) end
    end
    if order_id and qty then
      out[#out + 1] = order_id
      out[#out + 1] = qty
    end
  end
end
return {initial, stock, last_id, out}
