-- dead_letter.lua: moves one entry the order writer cannot write (malformed,
-- or refused by PostgreSQL for good) to the stream's dead-letter stream and
-- acknowledges it, in one atomic step. Done as two commands, a writer that
-- failed or died between the copy and the acknowledgement (or whose
-- acknowledgement failed) copied the entry again on every later attempt,
-- and the dead-letter count grew with each.
--
-- KEYS[1] {tag}:orders        the order stream
-- KEYS[2] {tag}:orders:dead   its dead-letter stream (same slot)
-- ARGV[1] the order writers' consumer group
-- ARGV[2] the entry's id
-- ARGV[3] why it cannot be written
-- ARGV[4..] the entry's fields and values, each field named "orig_<field>"
--
-- Returns 1 when the entry was moved now, 0 when it is not pending in the
-- group (another attempt or writer moved it already): then nothing is
-- written. An error (the XADD's, or the XACK's, after which the copy is
-- deleted again) leaves the entry pending and the dead-letter stream as it
-- was.

local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then
  return 0
end
local args = {'XADD', KEYS[2], '*', 'reason', ARGV[3], 'source_id', ARGV[2]}
for i = 4, #ARGV do
  args[#args + 1] = ARGV[i]
end
local copy = redis.call(unpack(args))
local acked = redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
if type(acked) == 'table' and acked.err then
  redis.call('XDEL', KEYS[2], copy)
  return acked
end
return 1
