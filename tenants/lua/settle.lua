-- Close a reservation once: free its slot and charge its real tokens instead of the reserved ones.
-- KEYS: 1 window costs hash  2 window token total  3 slots zset  4 month hash {used, gen, snapshot_ms}
--       5 reservation record
-- ARGV: 1 id  2 real tokens (0 refunds everything: a failed request, or a reserve whose answer was lost)
--       3 the month generation the reservation was made in  4 when the request ended (ms since the epoch)
--       5 tombstone ttl ms
-- Returns 1 when settled now, 0 when it was settled, released or expired before, or never admitted.
-- The record is replaced by a tombstone {closed}: a repeat of this call does nothing, and a reserve of the same
-- id that runs after it (sent before, still queued in a frozen Redis) admits nothing.
local function tombstone()
  redis.call('DEL', KEYS[5])
  redis.call('HSET', KEYS[5], 'closed', 1)
  redis.call('PEXPIRE', KEYS[5], ARGV[5])
end
local record = redis.call('HMGET', KEYS[5], 'cost', 'gen')
if not record[1] then
  if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end  -- closed before
  -- No record: never admitted, expired, or lost with a Redis that lost its data. In the last case the month
  -- counter was rebuilt from the usage table since (another generation), and that table holds this request's row
  -- only if the request ended before the rebuild read it.
  local month = redis.call('HMGET', KEYS[4], 'gen', 'snapshot_ms')
  if month[1] and month[1] ~= ARGV[3] and month[2] and tonumber(ARGV[4]) >= tonumber(month[2]) then
    redis.call('HINCRBY', KEYS[4], 'used', ARGV[2])
  end
  tombstone()
  return 0
end
tombstone()
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
