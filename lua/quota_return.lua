-- quota_return.lua: gives a buyer's quota back in their home bucket for an
-- order another bucket served, once its units went back on sale there
-- (cancelled or expired; see transition.lua, which can only reach its own
-- slot). Run by the engine right after the transition, and by the sweeper
-- for what a crash left; any number of times, it gives back once.
--
-- KEYS[1] {home}:q:<user>        integer, units the user bought, held or reserved
-- KEYS[2] {home}:u:<order_id>    set once the quota of this order came back
-- ARGV[1] units to give back (integer 1..2^53-1)
-- ARGV[2] seconds to keep KEYS[2] (1..2^31)
-- ARGV[3] "1" when the engine will WAIT for a replica (ack = replicated)
--
-- Returns 1 when given back now, 0 when given back before, -7 on a bad
-- argument.
--
-- Invariant: an order's quota comes back at most once, and a quota never
-- goes below zero.

local qty = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
if not qty or qty < 1 or qty ~= math.floor(qty) or qty > 9007199254740991
   or not ttl or ttl < 1 or ttl > 2147483648 or ttl ~= math.floor(ttl) then
  return -7
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  if ARGV[3] == '1' then
    -- Rewrite the mark unchanged so this call propagates: the engine's
    -- WAIT then covers the first call's give-back too.
    redis.call('SET', KEYS[2], '1', 'KEEPTTL')
  end
  return 0
end
local used = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if used > 0 then
  redis.call('DECRBY', KEYS[1], math.min(qty, used))
end
redis.call('SET', KEYS[2], '1', 'EX', ttl)
return 1
