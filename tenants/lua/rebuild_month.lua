-- Recreate a lost month counter from the usage table's sum, unless another process already did.
-- KEYS: 1 month hash
-- ARGV: 1 used tokens  2 generation  3 ttl s  4 when the usage table was read (ms since the epoch; see settle.lua)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'used', ARGV[1], 'gen', ARGV[2], 'snapshot_ms', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
