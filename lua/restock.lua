-- restock.lua: add units to one bucket of an open sale.
--
-- KEYS[1] {tag}:sale    hash; its field "initial" counts every unit ever put in
-- KEYS[2] {tag}:stock   integer, the units left in this bucket
-- ARGV[1] units to add (integer >= 1)
--
-- Returns the new stock, or -6 when the bucket does not exist, -5 when closed.
--
-- Invariant: "initial" grows by exactly what stock grows by, so the ledger
-- initial = remaining + sold keeps holding per bucket.

local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return -6
end
if state ~= 'open' then
  return -5
end
local qty = tonumber(ARGV[1])
redis.call('HINCRBY', KEYS[1], 'initial', qty)
return redis.call('INCRBY', KEYS[2], qty)
