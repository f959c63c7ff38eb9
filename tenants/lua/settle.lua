-- Close a reservation once: free its slot and charge its real tokens instead of the reserved ones.
-- KEYS: 1 window costs hash  2 window token total  3 slots zset  4 month hash {used, gen}  5 reservation record
-- ARGV: 1 id  2 real tokens (0 refunds everything: a failed request)
-- Returns 1 when settled now, 0 when it was settled, released or expired before.
local record = redis.call('HMGET', KEYS[5], 'cost', 'gen')
if not record[1] then return 0 end
redis.call('DEL', KEYS[5])
local reserved, actual = tonumber(record[1]), tonumber(ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
-- Still in the window: correct its cost and the window total together.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], actual)
  redis.call('INCRBY', KEYS[2], actual - reserved)
end
-- A month counter rebuilt since the reservation does not hold it: add the real tokens whole.
local gen = redis.call('HGET', KEYS[4], 'gen')
if gen then
  if gen == record[2] then
    redis.call('HINCRBY', KEYS[4], 'used', actual - reserved)
  else
    redis.call('HINCRBY', KEYS[4], 'used', actual)
  end
end
return 1
