-- settle.lua: close a pending request in the buyer's home bucket, once the
-- engine has tried the other buckets with take.lua.
--
-- KEYS[1] {tag}:q:<user>     integer, units this user has bought or reserved
-- KEYS[2] {tag}:r:<request>  request record: "P" (pending) or "C:<bucket>:<order_id>"
-- ARGV[1] outcome: "C" (confirmed elsewhere) or "S" (every bucket short)
-- ARGV[2] qty that purchase.lua reserved
-- ARGV[3] bucket that confirmed (outcome "C")
-- ARGV[4] order id that confirmed (outcome "C")
-- ARGV[5] seconds to keep the request record
--
-- Returns 1 when it settled the request, 0 when it was not pending any more
-- (a concurrent retry settled it first).
--
-- Invariant: the reserved quota is given back at most once, and only when no
-- bucket took stock for the request.

if redis.call('GET', KEYS[2]) ~= 'P' then
  return 0
end
if ARGV[1] == 'C' then
  redis.call('SET', KEYS[2], 'C:' .. ARGV[3] .. ':' .. ARGV[4], 'EX', tonumber(ARGV[5]))
  return 1
end
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('DECRBY', KEYS[1], tonumber(ARGV[2])) <= 0 then
    redis.call('DEL', KEYS[1])
  end
end
return 1
