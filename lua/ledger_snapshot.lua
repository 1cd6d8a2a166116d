-- ledger_snapshot.lua: one bucket's side of the ledger at one instant, for
-- reconcile. Read-only, and O(1): the stream's entries are read afterwards in
-- chunks (XRANGE up to last_id), so a long backlog never blocks the master.
--
-- KEYS[1] {tag}:sale     hash; field "initial" = every unit ever put in
-- KEYS[2] {tag}:stock    integer, units left
-- KEYS[3] {tag}:orders   the bucket's order stream
--
-- Returns {initial, stock, last_id}:
--   initial, stock   integers (0 when missing)
--   last_id          the stream's last generated id ("0-0" when none): every
--                    order this bucket made up to this instant has an id
--                    <= last_id, even the ones the writer already trimmed
--
-- Invariant: the three come from one atomic read, so
-- initial = stock + (units in orders with id <= last_id) holds exactly.

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
return {initial, stock, last_id}
