-- create_bucket.lua: create one bucket of a sale, unless it exists.
--
-- KEYS[1] {tag}:sale    hash describing the sale as this bucket sees it
-- KEYS[2] {tag}:stock   integer, the units in this bucket
-- ARGV[1] stock of this bucket
-- ARGV[2..] field, value pairs for KEYS[1] (sku, tag, bucket, buckets, state,
--           starts_ms, ends_ms, limit, initial)
--
-- Returns 1 when created, 0 when the bucket already existed (nothing changed).
--
-- Invariant: creating a sale twice never resets its stock.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('SET', KEYS[2], tonumber(ARGV[1]))
return 1
