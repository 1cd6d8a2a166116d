-- ack.lua: the check half of one group-commit round under ack = replicated,
-- run on a slot's master right before `WAIT 1` on the same connection (one
-- pipeline). Its write moves the connection's replication offset past every
-- earlier write on this node, so the WAIT that follows covers them; its reads
-- tell each waiting purchase whether this node holds *its* outcome (the
-- caller compares), so a WAIT answered by a node that never had the write, or
-- has another attempt's record, confirms nothing.
--
-- KEYS[1]      {tag}:ack-probe   a key of this slot no sale uses
-- KEYS[2..n]   what each waiter wrote: a request record (purchases) or a
--              bucket's sale hash (restocks), same slot
-- ARGV[1]      probe TTL in ms
-- ARGV[2..n]   per waiter, the hash field to read, or "" to read the key as
--              a string
--
-- Returns an array of n-1 strings: each value, "" when missing.
--
-- No checks: it never refuses. The probe write comes first on purpose.

redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
local out = {}
for i = 2, #KEYS do
  local field = ARGV[i] or ''
  if field == '' then
    out[i - 1] = redis.call('GET', KEYS[i]) or ''
  else
    out[i - 1] = redis.call('HGET', KEYS[i], field) or ''
  end
end
return out
