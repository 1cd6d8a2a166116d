-- ack.lua: the check half of one group-commit round under ack = replicated,
-- run on a slot's master right before `WAIT 1` on the same connection (one
-- pipeline). Its write moves the connection's replication offset past every
-- earlier write on this node, so the WAIT that follows covers them; its reads
-- tell each waiting purchase whether this node holds *its* outcome (the
-- caller compares), so a WAIT answered by a node that never had the write, or
-- has another attempt's record, confirms nothing.
--
-- KEYS[1]      {tag}:ack-probe   a key of this slot no sale uses
-- KEYS[2..n]   request records   one per waiting purchase, same slot
-- ARGV[1]      probe TTL in ms
--
-- Returns an array of n-1 strings: each record's value, "" when missing.
--
-- No checks: it never refuses. The probe write comes first on purpose.

redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
local out = {}
for i = 2, #KEYS do
  out[i - 1] = redis.call('GET', KEYS[i]) or ''
end
return out
