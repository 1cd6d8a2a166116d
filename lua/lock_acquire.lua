-- lock_acquire.lua: try to take a lock on one lock node (SET NX PX), and
-- report the node's fencing counter either way.
--
-- KEYS[1] flashsale:lock:<name>    the lock; its value is the grant's random token
-- KEYS[2] flashsale:fence:<name>   highest fencing token this node has seen
-- KEYS[3] flashsale:waiters:<name> how many clients wait for it (see
--         lock_waiting.lua, which counts them back out)
-- ARGV[1] token of this grant attempt
-- ARGV[2] ttl in milliseconds
-- ARGV[3] "1" when this node is the only lock node (then the fencing token
--         is settled here, in the same step), else "0" (one of a majority)
-- ARGV[4] with "1": the clock floor of the fencing token (unix_ms * 1000);
--         with "0": the token the client proposes (unix µs), which the
--         counter is raised to in the same step as the SET NX when it is
--         below it (see engine/src/lock/fence.rs for why that is enough)
-- ARGV[5] tokens reserved above the grant's own for hand-offs inside the
--         granted process (lock cohorting; "0" for none): the counter is
--         left at the grant's token plus this, so no later grant reuses one
-- ARGV[6] "0", or the ms a waiter count lives: when refused, count the
--         caller in KEYS[3] in the same step, so no release can fall
--         between the refusal and the count (and go unheard)
-- ARGV[7] ARGV[4] + ARGV[5] in decimal: what the counter is set to when
--         ARGV[4] is above it. The client adds, so this script formats no
--         number: string.format cost about a quarter of the script on the
--         master, and Lua's own tostring turns 16-digit tokens into
--         "1.7e+15"
--
-- Returns {granted, pttl, fence}:
--   {1, ttl, fence}    taken on this node; with ARGV[3] = "1", fence is
--                      the grant's token (KEYS[2] now holds it plus
--                      ARGV[5]); with "0", the counter before this call
--                      (the proposal holds on this node only if that is
--                      below it)
--   {0, pttl, fence}   held by another token; pttl = its remaining ms
-- fence is a decimal string or an integer ("0" when unknown).
--
-- Invariant: a held lock is never overwritten (NX), so at most one token
-- holds the key on this node at a time; the fencing counter only grows.

-- Is counter `a` below `b`? Both are decimal, unsigned, without leading
-- zeros (what these scripts and the client write), so the shorter is the
-- smaller, and equal lengths compare digit by digit: tonumber would run
-- strtod over 16 digits, a visible part of this script's cost.
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end

local seen = redis.call('GET', KEYS[2]) or '0'
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if below(seen, ARGV[4]) then
    -- The clock (one node) or the proposal (several) is above the counter:
    -- it is the token on one node, and the counter goes up to it either way.
    redis.call('SET', KEYS[2], ARGV[7])
    if ARGV[3] == '1' then
      return {1, tonumber(ARGV[2]), ARGV[4]}
    end
  elseif ARGV[3] == '1' then
    -- More than one grant this millisecond: the counter + 1, and the
    -- reserve above it. INCRBY replies an integer, so nothing is formatted.
    local reserve = tonumber(ARGV[5])
    return {1, tonumber(ARGV[2]), redis.call('INCRBY', KEYS[2], reserve + 1) - reserve}
  end
  return {1, tonumber(ARGV[2]), seen}
end
if ARGV[6] ~= '0' then
  redis.call('INCR', KEYS[3])
  -- Only ever lengthened, as in lock_waiting.lua.
  if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[6]) then
    redis.call('PEXPIRE', KEYS[3], ARGV[6])
  end
end
return {0, redis.call('PTTL', KEYS[1]), seen}
