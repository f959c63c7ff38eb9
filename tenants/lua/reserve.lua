-- Admit one request against a tenant's limits, all or nothing: requests and tokens in a sliding window
-- (an exact log: member = reservation id, score = admit time), concurrent slots that expire, the monthly budget.
-- KEYS: 1 window zset (id -> admit ms)   2 window costs hash (id -> tokens)   3 window token total
--       4 slots zset (id -> expiry ms)   5 month hash {used, gen}              6 reservation record hash {cost, gen}
-- ARGV: 1 id  2 cost  3 max requests  4 max tokens  5 max concurrent  6 max monthly
--       7 window ms  8 slot ttl ms  9 record ttl ms  10 retry ms when all slots are taken
--       11 ms until the next month
-- Returns {status, reason, retry_ms, requests_used, tokens_used, reset_ms, month_used[, month generation]};
-- status is 'ok', 'refused', 'rebuild' (the month counter is gone: rebuild it from the usage table, then call
-- again) or 'void' (this reservation was already closed, see settle.lua).
-- Idempotent: a reservation id already admitted (its record exists) is answered 'ok' without taking more.
local CHUNK = 500
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, cost = ARGV[1], tonumber(ARGV[2])
local max_requests, max_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_concurrent, max_month = tonumber(ARGV[5]), tonumber(ARGV[6])
local window, slot_ttl, record_ttl = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])

local month = redis.call('HMGET', KEYS[5], 'used', 'gen')
if not month[1] then return {'rebuild', '', 0, 0, 0, 0, 0} end
local month_used = tonumber(month[1])

local function costs_of(ids, first, last)
  local out = redis.call('HMGET', KEYS[2], unpack(ids, first, last))
  for i = 1, #out do out[i] = tonumber(out[i]) or 0 end
  return out
end

-- Drop what left the window (score <= now - window) and take its tokens off the total.
local horizon = now - window
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon)
local tokens_used = tonumber(redis.call('GET', KEYS[3]) or '0')
if #expired > 0 then
  for first = 1, #expired, CHUNK do
    local last = math.min(first + CHUNK - 1, #expired)
    for _, c in ipairs(costs_of(expired, first, last)) do tokens_used = tokens_used - c end
    redis.call('HDEL', KEYS[2], unpack(expired, first, last))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', horizon)
  redis.call('SET', KEYS[3], tokens_used, 'PX', window + 1000)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)

local requests_used = redis.call('ZCARD', KEYS[1])
local concurrent = redis.call('ZCARD', KEYS[4])

-- Sent again (its reply was lost with a connection): it was admitted once, and only once. A record that is only
-- a tombstone was closed before this call ran (the caller gave up on it after a timeout): admit nothing.
local known = redis.call('HMGET', KEYS[6], 'cost', 'closed')
if known[1] then
  return {'ok', '', 0, requests_used, tokens_used, window, month_used, month[2]}
elseif known[2] then
  return {'void', '', 0, requests_used, tokens_used, 0, month_used}
end

-- When enough tokens will have left the window for `need` more: walk the log from its oldest entry.
local function tokens_free_in(need)
  local freed, start = 0, 0
  while true do
    local page = redis.call('ZRANGE', KEYS[1], start, start + CHUNK - 1, 'WITHSCORES')
    if #page == 0 then return window end
    local ids = {}
    for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
    local costs = costs_of(ids, 1, #ids)
    for i = 1, #ids do
      freed = freed + costs[i]
      if freed >= need then return tonumber(page[2 * i]) + window - now end
    end
    start = start + CHUNK
  end
end

local reason, retry = '', -1
local function refuse(why, ms)
  if ms > retry then reason, retry = why, ms end
end
if requests_used + 1 > max_requests then
  local nth = redis.call('ZRANGE', KEYS[1], requests_used - max_requests, requests_used - max_requests, 'WITHSCORES')
  refuse('requests_per_minute', tonumber(nth[2]) + window - now)
end
if tokens_used + cost > max_tokens then refuse('tokens_per_minute', tokens_free_in(tokens_used + cost - max_tokens)) end
if concurrent + 1 > max_concurrent then refuse('max_concurrent_requests', tonumber(ARGV[10])) end
if month_used + cost > max_month then refuse('monthly_tokens', tonumber(ARGV[11])) end

local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if reason ~= '' then
  local reset = 0
  if #newest > 0 then reset = tonumber(newest[2]) + window - now end
  return {'refused', reason, retry, requests_used, tokens_used, reset, month_used}
end

redis.call('ZADD', KEYS[1], now, id)
redis.call('HSET', KEYS[2], id, cost)
tokens_used = redis.call('INCRBY', KEYS[3], cost)
redis.call('ZADD', KEYS[4], now + slot_ttl, id)
month_used = redis.call('HINCRBY', KEYS[5], 'used', cost)
redis.call('HSET', KEYS[6], 'cost', cost, 'gen', month[2])
redis.call('PEXPIRE', KEYS[6], record_ttl)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], window + 1000) end
redis.call('PEXPIRE', KEYS[4], slot_ttl + 1000)
return {'ok', '', 0, requests_used + 1, tokens_used, window, month_used, month[2]}
