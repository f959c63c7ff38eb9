-- Keep a live request's concurrency slot: its expiry moves to now + ttl, only while the slot is still held
-- (a settled or released reservation's slot never comes back).
-- KEYS: 1 slots zset (id -> expiry ms)
-- ARGV: 1 id  2 slot ttl ms
-- Returns 1 when the slot was renewed, 0 when it is no longer held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[1], ttl + 1000) end
return 1
