-- semaphore_permits.lua: read, or raise to a newer version, a semaphore's
-- total of permits on one lock node.
--
-- KEYS[1] flashsale:sem:<name>:permits   "<version> <permits>"
-- ARGV[1] "get" or "set"
-- ARGV[2] set: the version of this setting (decimal, grows with the clock)
-- ARGV[3] set: the total of permits (decimal, 1..1000)
--
-- Returns the setting this node holds after the call, "<version> <permits>",
-- or "" when it has none.
--
-- Invariant: a node never goes back to an older setting, so a reader that
-- asks a majority and keeps the highest version sees the last setting a
-- majority took (two majorities share a node).

local cur = redis.call('GET', KEYS[1]) or ''
if ARGV[1] ~= 'set' then
  return cur
end
local version = tonumber(ARGV[2])
local permits = tonumber(ARGV[3])
if not version or not permits or permits < 1 or permits > 1000 then
  return redis.error_reply('ERR semaphore_permits.lua: bad version or permits')
end
local have = tonumber(string.match(cur, '^(%d+) ') or '-1')
if version > have then
  cur = ARGV[2] .. ' ' .. ARGV[3]
  redis.call('SET', KEYS[1], cur)
end
return cur
