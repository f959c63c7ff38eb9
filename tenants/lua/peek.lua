-- Read-only view of a tenant's sliding window, for the x-ratelimit-* headers of answers that reserve nothing.
-- KEYS: 1 window zset (id -> admit ms)   2 window costs hash (id -> tokens)   3 window token total
-- ARGV: 1 window ms
-- Returns {requests_used, tokens_used, reset_ms}, counting only what reserve.lua would still count.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local horizon = now - window
local tokens_used = tonumber(redis.call('GET', KEYS[3]) or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon)
for first = 1, #expired, 500 do
  local last = math.min(first + 499, #expired)
  for _, c in ipairs(redis.call('HMGET', KEYS[2], unpack(expired, first, last))) do
    tokens_used = tokens_used - (tonumber(c) or 0)
  end
end
local requests_used = redis.call('ZCOUNT', KEYS[1], '(' .. horizon, '+inf')
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local reset = 0
if #newest > 0 then reset = math.max(0, tonumber(newest[2]) + window - now) end
return {requests_used, math.max(0, tokens_used), reset}
