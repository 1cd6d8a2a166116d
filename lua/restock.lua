-- restock.lua: add units to one bucket of an open sale, once per operation.
--
-- KEYS[1] {tag}:sale    hash; "initial" counts every unit ever put in, and
--                       "op:<operation id>" records each restock applied here
-- KEYS[2] {tag}:stock   integer, the units left in this bucket
-- ARGV[1] units to add (integer 1..2^53-1)
-- ARGV[2] operation id (the admin call's idempotency key)
-- ARGV[3] "finish" to apply even to a closed bucket: the engine checked the
--         sale was open when the operation was accepted, so a close landing
--         half-way does not leave it half-applied
--
-- Returns {code, n}:
--   { 1, stock}   applied now; n is the new stock
--   { 2, units}   this operation was applied here before (nothing changed);
--                 n is the units it added then
--   {-5, 0}       sale closed
--   {-6, 0}       no such bucket
--   {-7, 0}       invalid units
--   {-8, units}   this operation id was used with other units
--   {-9, initial} initial + units would pass 2^53-1 (the largest integer a
--                 Lua number holds exactly)
--
-- Invariants: "initial" grows by exactly what stock grows by, so the ledger
-- initial = remaining + sold keeps holding per bucket; a retried operation
-- (a timeout, a paused master, a client that went away) is applied once.

local MAX = 9007199254740991
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {-6, 0}
end
local units = tonumber(ARGV[1])
if not units or units < 1 or units > MAX or units ~= math.floor(units) or ARGV[2] == '' then
  return {-7, 0}
end
local done = redis.call('HGET', KEYS[1], 'op:' .. ARGV[2])
if done then
  if tonumber(done) ~= units then
    return {-8, tonumber(done)}
  end
  return {2, units}
end
if state ~= 'open' and ARGV[3] ~= 'finish' then
  return {-5, 0}
end
local initial = tonumber(redis.call('HGET', KEYS[1], 'initial') or '0')
if initial + units > MAX then
  return {-9, initial}
end
redis.call('HINCRBY', KEYS[1], 'initial', units)
redis.call('HSET', KEYS[1], 'op:' .. ARGV[2], units)
return {1, redis.call('INCRBY', KEYS[2], units)}
