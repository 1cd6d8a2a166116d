-- latch.lua: a count-down latch on one lock node.
--
-- KEYS[1] flashsale:latch:<name>:count   the count the latch starts from
-- KEYS[2] flashsale:latch:<name>:downs   set of the ids of the count-downs seen
-- ARGV[1] "init", "down", "read" or "members"
-- ARGV[2] init: the count (1..10000); down: the count-down's id (1-200 bytes)
-- ARGV[3] init: when the latch ends, ms since the Unix epoch ("0" or
--         absent: never), set only with the count (a count already here
--         keeps its own). A deadline, not a duration, so that every node
--         ends the latch at the same moment, a node the init reaches late
--         included (past the deadline, it creates nothing);
--         down: the pub/sub channel to announce the opening on
-- ARGV[4] down: the name published on it
--
-- Returns {count, x}: the count ("" when the latch was never set), and
--   init, down, read: the number of distinct count-downs seen (down: -1
--     when the latch has no count here, nothing recorded);
--   members: the ids of the count-downs seen (an array);
-- read also returns a third value: when the count ends (PEXPIRETIME: ms
--   since the epoch, -1 never, -2 no count), which the engine copies to a
--   node that lacks the count.
--
-- Invariants: a count, once set, never changes (a second init keeps the
-- first); a count-down is counted once however often its id is resent
-- (SADD), so a retry never opens the latch early; once this node has seen
-- `count` ids it records no more, so the set stays within the count; the
-- opening is announced when this node's count-downs reach the count; the
-- set of count-downs expires when the count does (each count-down that adds
-- an id sets it), so a latch given a lifetime leaves no key behind.

local op = ARGV[1]
if op == 'init' then
  local n = tonumber(ARGV[2])
  if not n or n < 1 or n > 10000 or n ~= math.floor(n) then
    return redis.error_reply('ERR latch.lua: bad count')
  end
  local ends = tonumber(ARGV[3] or '0')
  if not ends or ends < 0 or ends > 9007199254740991 or ends ~= math.floor(ends) then
    return redis.error_reply('ERR latch.lua: bad deadline')
  end
  if ends > 0 then
    -- A deadline already past sets nothing (Redis drops the key at once).
    redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PXAT', string.format('%d', ends))
  else
    redis.call('SET', KEYS[1], ARGV[2], 'NX')
  end
  return {redis.call('GET', KEYS[1]), redis.call('SCARD', KEYS[2])}
end
local count = redis.call('GET', KEYS[1]) or ''

-- The set of count-downs ends when the count does (a set made or filled
-- by an older engine's count-downs has no expiry of its own).
local function end_with_count()
  local ends = redis.call('PEXPIRETIME', KEYS[1])
  if ends > 0 then
    redis.call('PEXPIREAT', KEYS[2], ends)
  end
end

if op == 'down' then
  if count == '' or #ARGV[2] < 1 or #ARGV[2] > 200 then
    return {count, -1}
  end
  local seen = redis.call('SCARD', KEYS[2])
  if seen >= tonumber(count) then
    -- Full already: still give the set the count's end if it has none.
    if redis.call('PTTL', KEYS[2]) == -1 then
      end_with_count()
    end
    return {count, seen}
  end
  local added = redis.call('SADD', KEYS[2], ARGV[2])
  if added == 1 then
    end_with_count()
  end
  seen = seen + added
  if added == 1 and seen >= tonumber(count) then
    redis.call('PUBLISH', ARGV[3], ARGV[4])
  end
  return {count, seen}
end
if op == 'members' then
  return {count, redis.call('SMEMBERS', KEYS[2])}
end
if op == 'read' then
  return {count, redis.call('SCARD', KEYS[2]), redis.call('PEXPIRETIME', KEYS[1])}
end
return {count, redis.call('SCARD', KEYS[2])}
