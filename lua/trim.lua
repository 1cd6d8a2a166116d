-- trim.lua: deletes the entries of an order stream that every consumer group
-- of the stream is done with, in one atomic step. Read in separate round
-- trips, a group created at id 0 between the read of the groups and the
-- XTRIM (an audit reader starting while the writers drain) lost entries
-- that were in the stream when it was made; here nothing can come between.
--
-- KEYS[1] {tag}:orders   the order stream
-- ARGV[1] the order writers' consumer group
--
-- Returns the number of entries deleted (0 when nothing may be: no stream,
-- or the writers' group is not on it).
--
-- Bound: the lowest, over every group, of the id after its last delivered
-- one (what it has not read) and its oldest pending entry (what it read but
-- has not acknowledged). Not bounded by one writer's acknowledgements: with
-- several writers in the group, whichever trims last trims what the others
-- acknowledged. Nothing is trimmed unless ARGV[1] is among the groups: its
-- bound is what says the entries below were written, and a group that is
-- missing (destroyed, or a promoted replica that never had it) would leave
-- the trim to other groups alone. Writes nothing before that is known.

-- Is decimal `a` below decimal `b`? Stream id parts go up to 2^64, past
-- what a Lua number holds exactly: compared as strings (no leading zeros,
-- as Redis writes them), the shorter is the smaller.
local function below(a, b)
  return #a < #b or (#a == #b and a < b)
end

local function id_below(x, y)
  local xm, xs = string.match(x, '^(%d+)-(%d+)$')
  local ym, ys = string.match(y, '^(%d+)-(%d+)$')
  if xm == ym then
    return below(xs, ys)
  end
  return below(xm, ym)
end

-- The id right after `id`. A sequence too long to add 1 to exactly (only
-- an id written by hand has one) gives `id` itself: one entry kept longer.
local function after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if #seq < 15 then
    return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
  end
  return id
end

local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
if groups.err then
  return 0
end
local ours = false
local bound = nil
local function lower(id)
  if not bound or id_below(id, bound) then
    bound = id
  end
end
for _, g in ipairs(groups) do
  local name, pending, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then
      name = g[i + 1]
    elseif g[i] == 'pending' then
      pending = g[i + 1]
    elseif g[i] == 'last-delivered-id' then
      delivered = g[i + 1]
    end
  end
  if not name or not delivered then
    return 0
  end
  ours = ours or name == ARGV[1]
  lower(after(delivered))
  if pending and pending > 0 then
    local summary = redis.call('XPENDING', KEYS[1], name)
    if not summary[2] then
      return 0
    end
    lower(summary[2])
  end
end
if not ours or not bound then
  return 0
end
return redis.call('XTRIM', KEYS[1], 'MINID', bound)
