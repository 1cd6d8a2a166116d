-- rw_extend.lua: renew one holder of a read-write lock only if it still
-- holds it (the watchdog's renewal, and extend).
--
-- KEYS[1] flashsale:rw:<name>   the holders (see rw_acquire.lua)
-- ARGV[1] the holder's field: "r:<token>" or "w:<token>"
-- ARGV[2] new ttl in milliseconds
--
-- Returns 1 when extended, 0 when this holder is not there or its lease
-- ended.
--
-- Invariant: an ended hold is never brought back.

local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 then
  return redis.error_reply('ERR rw_extend: ttl must be a positive number')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if ends <= now then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], now + ttl)
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
