-- forget_consumers.lua: deletes the consumers of the order writers' group
-- that have nothing pending and have not been heard from for a while (a
-- writer process that stopped or died), in one atomic step. Each writer
-- process names its consumers anew (`writer-<pid>-<random>-<i>`), so
-- without this a group collects one dead consumer per writer ever started,
-- in every order stream, for good.
--
-- KEYS[1] {tag}:orders   the order stream
-- ARGV[1] the order writers' consumer group
-- ARGV[2] the calling writer's own consumer name (never deleted)
-- ARGV[3] least idle time, ms, of a consumer to delete
--
-- Returns the number of consumers deleted (0 when the stream or the group
-- is missing).
--
-- Invariant: no entry is ever dropped. XGROUP DELCONSUMER drops the
-- consumer's pending entries with it, so a consumer is deleted only with
-- none pending, checked in the same script: nothing can read an entry into
-- its pending list between the check and the delete. A consumer deleted
-- while still alive but idle loses nothing; its next XREADGROUP makes it
-- again. All checks are done before the first write.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local found = false
for _, g in ipairs(groups) do
  for i = 1, #g, 2 do
    if g[i] == 'name' and g[i + 1] == ARGV[1] then
      found = true
    end
  end
end
if not found then
  return 0
end
local least_idle = tonumber(ARGV[3])
local dead = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do
    f[c[i]] = c[i + 1]
  end
  if f['name'] ~= ARGV[2] and f['pending'] == 0 and f['idle'] >= least_idle then
    dead[#dead + 1] = f['name']
  end
end
for _, name in ipairs(dead) do
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
end
return #dead
