package redis

import goredis "github.com/redis/go-redis/v9"

// Every script reads the clock with redis.call('TIME'), so leases are
// measured on the server alone. Numbers written to Redis go through
// string.format('%.0f'): Redis would otherwise print a Lua number in a
// shortest or 14-digit form and lose digits of a microsecond fence. Lua
// numbers are doubles, exact below 2^53 (µs since 1970 stay below that until
// the year 2255).

// restartedHolder is the holder the claim script names while the restart
// guard holds every run. No instance id has this form.
const restartedHolder = "(server restarted empty)"

// claimScript grants a run, or says why not. Any status but running and
// interrupted is terminal (claim.Status.Live).
//
// KEYS: run hash, job fence, job history zset, jobs set, epoch marker.
// ARGV: token, holder, lease ms, done TTL ms, scheduled ms, run id, job,
// history limit, fence slot, fence slots, restart guard ("" off, "1" the
// caller has seen the marker on this server, "0" it has not).
//
// Replies: {"granted", fence, attempt, lease_until_ms},
// {"held", holder, lease_until_ms, token digest, attempt},
// {"done", status, attempt}. While the restart guard holds every run (see
// the package comment) the reply is held by restartedHolder.
var claimScript = goredis.NewScript(`
local function s(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
if ARGV[11] ~= '' then
  local born = redis.call('GET', KEYS[5])
  if not born then
    born = 0
    if ARGV[11] == '1' then born = now end
    redis.call('SET', KEYS[5], s(born))
  end
  local until_ms = tonumber(born) + tonumber(ARGV[3])
  if now < until_ms then
    return {'held', '` + restartedHolder + `', until_ms, '', 0}
  end
end
local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'lease_until', 'attempt', 'holder', 'fence')
local attempt = 1
if h[2] then
  if h[1] == ARGV[1] and h[2] == 'running' then
    -- The client retried a request that had already granted.
    return {'granted', tonumber(h[6]), tonumber(h[4]), tonumber(h[3])}
  end
  if h[2] ~= 'running' and h[2] ~= 'interrupted' then
    return {'done', h[2], tonumber(h[4])}
  end
  if h[2] == 'running' and tonumber(h[3]) > now then
    return {'held', h[5] or '', tonumber(h[3]), string.sub(redis.sha1hex(h[1] or ''), 1, 16), tonumber(h[4])}
  end
  attempt = tonumber(h[4]) + 1
end
local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now_us)
local slots = tonumber(ARGV[10])
fence = fence + (tonumber(ARGV[9]) - fence) % slots
redis.call('SET', KEYS[2], s(fence))
local lease_until = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[2], 'fence', s(fence),
  'attempt', s(attempt), 'status', 'running', 'started_at', s(now), 'lease_until', s(lease_until))
redis.call('HDEL', KEYS[1], 'finished_at')
redis.call('PEXPIRE', KEYS[1], s(tonumber(ARGV[4]) + tonumber(ARGV[3])))
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6])
redis.call('SADD', KEYS[4], ARGV[7])
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[8])
if over > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
end
return {'granted', fence, attempt, lease_until}
`)

// renewScript extends a live lease held with the token.
//
// KEYS: run hash. ARGV: token, lease ms, done TTL ms.
// Replies: {"renewed", lease_until_ms} or {"lost", reason}.
var renewScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'lease_until')
if not h[1] then return {'lost', 'no such run'} end
if h[1] ~= ARGV[1] then return {'lost', 'taken over'} end
if h[2] ~= 'running' then return {'lost', 'released'} end
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
if tonumber(h[3]) <= now then return {'lost', 'expired'} end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', string.format('%.0f', lease_until))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', tonumber(ARGV[3]) + tonumber(ARGV[2])))
return {'renewed', lease_until}
`)

// releaseScript ends the claim held with the token. Releasing again with
// the same outcome (a client retrying after a lost reply) is a no-op that
// replies released.
//
// KEYS: run hash. ARGV: token, outcome, done TTL ms, "1" if the outcome is
// terminal.
// Replies: {"released"} or {"lost", reason}.
var releaseScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'token', 'status')
if not h[1] then return {'lost', 'no such run'} end
if h[1] ~= ARGV[1] then return {'lost', 'taken over'} end
if h[2] == ARGV[2] then return {'released'} end
if h[2] ~= 'running' then return {'lost', 'released'} end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
if ARGV[4] == '1' then
  local t = redis.call('TIME')
  local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
  redis.call('HSET', KEYS[1], 'finished_at', string.format('%.0f', now))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'released'}
`)

// abortScript undoes a grant nobody will use (a lost quorum, a cancelled
// request): a fresh run disappears, a takeover goes back to the attempt it
// replaced, ready to be taken over at once. Fences are never given back.
//
// KEYS: run hash, job history zset. ARGV: token, run id.
// Reply: 1 if undone, 0 if the token no longer held the run.
var abortScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'attempt')
if h[1] ~= ARGV[1] or h[2] ~= 'running' then return 0 end
local attempt = tonumber(h[3])
if attempt <= 1 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('HSET', KEYS[1], 'status', 'interrupted', 'attempt', string.format('%.0f', attempt - 1))
end
return 1
`)

// commitScript makes a quorum's decision durable on one node: the job's
// fence key is raised to the granted fence, and the run hash (if the token
// still holds it) gets the fence and attempt the quorum agreed on, so the
// next takeover on any majority counts on from there.
//
// KEYS: run hash, job fence. ARGV: token, fence, attempt.
// Reply: 1 if the run hash was updated, 0 if only the fence was raised.
var commitScript = goredis.NewScript(`
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
local h = redis.call('HMGET', KEYS[1], 'token', 'status')
if h[1] ~= ARGV[1] or h[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[2], 'attempt', ARGV[3])
return 1
`)
