-- create_meta.lua: claim a SKU for a sale and record its whole plan (tags,
-- stock, window, limit) in one atomic step, or find the plan of the create
-- that claimed it first.
--
-- The rest of a create (the index entry, then each bucket, then "created")
-- follows from the plan and is idempotent, so a create that was cut off at
-- any point (timeout, a caller that went away, a crash) is finished by
-- running the same plan again: the same operation, `flashsale sale repair`,
-- or any later create of the SKU.
--
-- KEYS[1] {fs:<sku>}:meta   hash: sku, op, tags, stock, buckets, limit,
--                            starts_ms, ends_ms, created ("0" until every
--                            bucket exists and the sale is indexed)
-- ARGV[1] operation id
-- ARGV[2..] field, value pairs of the plan (sku, tags, stock, buckets,
--           limit, starts_ms, ends_ms)
--
-- Returns {code, op, created}:
--   {1, op, "0"}        claimed now by this operation
--   {2, op, created}    claimed before by this same operation (a retry)
--   {3, op, created}    claimed before by another operation
--   {4, op, created}    claimed before by this operation, with another plan
--                       (the operation id was reused with other parameters)
--
-- Invariant: a SKU's plan is written once and never changed by a create.

local op = redis.call('HGET', KEYS[1], 'op')
if op then
  local created = redis.call('HGET', KEYS[1], 'created') or '1'
  if op == ARGV[1] then
    -- A retry must ask for the same sale; the tags are picked anew on each
    -- call, so they are not compared.
    for i = 2, #ARGV, 2 do
      if ARGV[i] ~= 'tags' and redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
        return {4, op, created}
      end
    end
    return {2, op, created}
  end
  return {3, op, created}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- A sale made before operation ids existed: complete, foreign.
  return {3, '', '1'}
end
local fields = {'op', ARGV[1], 'created', '0'}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
return {1, ARGV[1], '0'}
