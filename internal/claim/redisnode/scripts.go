package redisnode

import goredis "github.com/redis/go-redis/v9"

// Every script reads the clock with redis.call('TIME'), so leases are
// measured on the server alone. Numbers written to Redis go through
// string.format('%.0f'): Redis would otherwise print a Lua number in a
// shortest or 14-digit form and lose digits of a microsecond fence. Lua
// numbers are doubles, exact below 2^53 (µs since 1970 stay below that until
// the year 2255).

// incarnationLua is the prelude of every script that must know which
// server incarnation it runs on. server() reads the run_id Redis draws at
// every start, from INFO in the script itself, so no replica's memory is
// trusted for it; in the function library (library.go) it keeps it for
// the life of the library's Lua state, which never outlives the server's
// process. (INFO is the dearest call of a one-run claim, about 5 µs of
// the server's time; the run_id is found by a plain search, and the
// uptime read only when the marker does not match, which saved another
// 3.4 µs a call against two pattern matches.) incarnation() compares it with the namespace's marker
// (a hash: run_id, since, hold) and returns the run_id, when the restart
// guard began (0: no guard) and until when a write-back of done markers
// extends it (Restore). A marker naming another run_id means
// the data came back from disk or a replica, and may lack the latest
// writes; a missing marker means an emptied server or a new namespace,
// which nothing tells apart: either starts the guard now. A missing
// marker needs no guard on a server up for longer than a lease (every
// claim of an earlier incarnation has expired for its holder by then),
// unless the caller saw a marker before, on this incarnation or an earlier
// one (then the keys were deleted under it, or the server lost them while
// the caller could not reach it for longer than a lease: the done markers
// the replicas write back still need the guard to land before anyone
// claims), or this server emptied keys in bulk since it started
// (emptied(): a FLUSHALL, FLUSHDB or SWAPDB called, or keys evicted),
// or the server was a replica once (promoted()):
// its uptime does not say since when it is a master, and replication is
// asynchronous, so a marker written just before the failover, and the
// claims after it, may never have reached it. On a cluster, where a marker
// is one per bucket, that is a bucket whose first claims were the last
// ones the old master made.
//
// The marker also names the server's replication history (lineage(): its
// master_replid), which a full sync from another server replaces and a
// promotion renews. A server made a replica of its own earlier copy (a
// replica detached, then the old master re-attached under it, as a
// failover tool may) goes back in time with its process, and so its
// run_id, unchanged: the copy's marker named it, no guard began, and a
// standby took over a run its holder had finished, which ran again (an
// outside review: 2 of 2 tries, and no loss reported). Another history
// under the same run_id, on a server that has been a replica since it
// started (promoted()), starts the guard now, as another run_id does. A
// marker without one (written by an earlier version), or another history
// on a server never a replica (a master given its first replica takes a
// new replication id with its backlog: the explorer's copy of the server
// began a guard, and so would adding a replica in production), is given
// the current one. Unlike
// server(), lineage() is read on every call (INFO replication, about 1 µs
// of the server's time): a full sync does not make the function
// library's Lua state anew (Redis 7.0: a local kept there survived
// REPLICAOF and a promotion), so a kept value named the history before
// the rewind, matched the copy's marker, and the explorer's rewind class
// saw finished runs granted again at once.
//
// emptied() closes most of what "a caller that saw a marker" leaves open:
// a replica started, or a one-shot command run, just after a FLUSHALL on
// a server up for longer than a lease, was the first to find the marker
// gone, wrote it anew with no guard, and was granted a run its holder
// still ran (an outside review: two executions at once, and nobody
// reported the loss, since the old replicas then found a marker of this
// server). Keys deleted one by one (DEL of the namespace's keys by hand)
// leave no such trace, and stay an exposure (docs/hardening.md).
const incarnationLua = `
local function s(x) return string.format('%.0f', x) end
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local run_id
local function server()
  if run_id then return run_id end
  local info = redis.call('INFO', 'server')
  local i = string.find(info, 'run_id:', 1, true)
  run_id = string.sub(info, i + 7, i + 46)
  return run_id
end
local function lineage()
  local info = redis.call('INFO', 'replication')
  local i = string.find(info, 'master_replid:', 1, true)
  return string.sub(info, i + 14, i + 53)
end
local function uptime()
  return tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')) * 1000
end
local function promoted()
  local off = string.match(redis.call('INFO', 'replication'), 'second_repl_offset:(%-?%d+)')
  return off ~= nil and off ~= '-1'
end
local function emptied()
  local calls = redis.call('INFO', 'commandstats')
  for _, c in ipairs({'flushall', 'flushdb', 'swapdb'}) do
    if string.find(calls, 'cmdstat_' .. c .. ':', 1, true) then return true end
  end
  return tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)') or '0') > 0
end
local function incarnation(marker, seen, lease, now)
  local id = server()
  local m = redis.call('HMGET', marker, 'run_id', 'since', 'hold', 'replid')
  if m[1] == id then
    local r = lineage()
    if m[4] == r then return id, tonumber(m[2]) or now, tonumber(m[3]) or 0 end
    if not m[4] or not promoted() then
      -- Written by a version that did not name the history; or a new
      -- history with no sync into this server (a master given its first
      -- replica takes a new replication id with its backlog): the same
      -- data.
      redis.call('HSET', marker, 'replid', r)
      return id, tonumber(m[2]) or now, tonumber(m[3]) or 0
    end
  end
  local since = now
  if not m[1] and seen == '' and uptime() >= lease and not promoted() and not emptied() then since = 0 end
  -- One HSET, every field (no DEL first): a server out of memory refuses
  -- it before the script has written anything, where after a DEL, which
  -- it lets through, it allows every later write of the script. So the
  -- guard begins when writes land, not while they are refused, when it
  -- could run out before any write-back could land.
  redis.call('HSET', marker, 'run_id', id, 'since', s(since), 'hold', '0', 'replid', lineage())
  return id, since, 0
end
`

// eachLua is the prelude of the batch scripts: each(f, ...) calls f for
// one run and turns an error it raises (a key of the wrong type, a field
// that does not parse) into that run's reply, {"error", message}. Redis
// does not undo a script's writes when it fails part way, so one bad run
// must not fail the call: the runs before it in the call would be granted
// (or released) yet answered as errors.
const eachLua = `
local function each(f, ...)
  local ok, r = pcall(f, ...)
  if ok then return r end
  local msg = r
  if type(r) == 'table' and r.err then msg = r.err end
  msg = tostring(msg)
  -- The server cannot write now (raised before any write of the call, so
  -- nothing is left half done): the whole call fails, as it did.
  for _, code in ipairs({'OOM', 'READONLY', 'NOREPLICAS', 'MISCONF', 'MASTERDOWN', 'BUSY'}) do
    if string.sub(msg, 1, #code + 1) == code .. ' ' then error({err = msg}) end
  end
  return {'error', msg}
end
`

// claimBody (claimProgram) grants runs, or says why not, each run as it would alone:
// a batch is one script call (at most scriptRuns runs, all of one bucket)
// so that the server checks its incarnation once, not once per run, and
// pays the fixed cost of a call once. Any status but running and
// interrupted is terminal (claim.Status.Live). A grant records the
// server's run_id in the run, so that a renewal can tell a claim of this
// incarnation from one restored from disk.
//
// KEYS: jobs set, marker, then per run: run hash, job fence, job history
// zset.
// ARGV: holder, lease ms, done TTL ms, history limit, fence slot, fence
// slots, the run_id the caller last saw the marker on ("" if none), the
// latest server time in ms at which the call may take over a lapsed
// lease ("" for no limit; "0" when the caller saw the server fail to
// answer within the last lease, claim.Unanswered; else its send plus the
// server's clock offset and a quarter lease, serverClocks: a call that
// waited longer in the server may have overtaken a release that waited
// there too), the page size (0: no page), then per run: token, scheduled
// ms, run id, job. A token is a bid and a try (claim.Bids): a later try
// of a bid is granted a live grant an earlier try left on this
// incarnation, with a lease from now.
//
// A grant's page (claim.Claim.Page) is its job's newest runs, as History
// reads them, in the grant's own step: per run its id, status, holder,
// fence, attempt, started_at, lease_until and finished_at, flat; false
// where a run in it has expired (History would page on past it: the
// runner reads instead). The page's run hashes are named from the
// granted run's own key, in its bucket (one slot on a cluster).
//
// Reply: the server's run_id, its time in ms, then either "restarted",
// guard_start_ms, guard_end_ms (the restart guard holds every run) or
// one reply per run:
// {"granted", fence, attempt, lease_until_ms, page},
// {"held", holder, lease_until_ms, token digest, attempt},
// {"done", status, attempt, holder, fence}, or {"error", message}.
const claimBody = `
local now_us = clock()
local now = math.floor(now_us / 1000)
local lease = tonumber(ARGV[2])
local id, since, hold = incarnation(KEYS[2], ARGV[7], lease, now)
if since > 0 and now < math.max(since + lease, hold) then
  return {id, now, 'restarted', since, math.max(since + lease, hold)}
end
local holder, ttl, limit = ARGV[1], s(tonumber(ARGV[3]) + lease), tonumber(ARGV[4])
local slot, slots = tonumber(ARGV[5]), tonumber(ARGV[6])
local takeover_by = tonumber(ARGV[8])
local page_size = tonumber(ARGV[9])
local function page(run, hkey, rid)
  if page_size <= 0 then return false end
  local pre = string.sub(run, 1, #run - #rid)
  local out = {}
  for _, other in ipairs(redis.call('ZREVRANGE', hkey, 0, page_size - 1)) do
    local h = redis.call('HMGET', pre .. other, 'status', 'holder', 'fence', 'attempt', 'started_at', 'lease_until', 'finished_at')
    if not h[1] then return false end
    out[#out + 1] = other
    for k = 1, 7 do out[#out + 1] = h[k] end
  end
  return out
end
-- From the microsecond rounded up, not the millisecond the grant fell in:
-- a lease cut short by up to a millisecond could be taken over before
-- its holder's request time + lease (the explorer found one, seed 7300012).
local lease_until = math.ceil(now_us / 1000) + lease
-- A token is "<bid>-<try>" (claim.Bids); older replicas' have no try.
-- later(a, b): token a is a later try of b's bid.
local function later(a, b)
  if not b then return false end
  local na, ta = string.match(a, '^(.+)%-(%d+)$')
  local nb, tb = string.match(b, '^(.+)%-(%d+)$')
  return na ~= nil and na == nb and tonumber(ta) > tonumber(tb)
end
-- next_fence raises the job's fence key past every fence granted before
-- (and to this node's residue, slot of slots) and returns it.
local function next_fence(fkey)
  local fence = math.max(tonumber(redis.call('GET', fkey) or '0') + 1, now_us)
  fence = fence + (slot - fence) % slots
  redis.call('SET', fkey, s(fence))
  return fence
end
local function grant(run, fkey, hkey, token, at, rid, job)
  local h = redis.call('HMGET', run, 'token', 'status', 'lease_until', 'attempt', 'holder', 'fence', 'base', 'server')
  local attempt, base = 1, 0
  if h[2] then
    if h[1] == token and h[2] == 'running' then
      -- The client retried a request that had already granted.
      return {'granted', tonumber(h[6]), tonumber(h[4]), tonumber(h[3]), page(run, hkey, rid)}
    end
    if h[2] == 'running' and tonumber(h[3]) > now and h[8] == id and later(token, h[1]) then
      -- An earlier try of this bid granted, and its caller never heard
      -- (the reply and the undo lost to a stall): the grant is this
      -- try's, with a lease from now, as a renewal's. The old token no
      -- longer holds it, so that try's undo, landing late, undoes nothing.
      -- Only a later try takes it: an earlier one that lands late (a
      -- stalled connection) must not take the grant from the try that
      -- won it, nor extend a lease its caller gave up. It is fenced
      -- anew, as a grant made now: this try may have left after the
      -- reply of a later grant of the job (a stall let the earlier try
      -- in behind it), and a fence must rise with what its holder could
      -- have seen (the explorer's fence order, under a real SIGSTOP).
      -- The earlier try's fence was never heard of: nobody holds it.
      local fence = next_fence(fkey)
      redis.call('HSET', run, 'token', token, 'lease_until', s(lease_until), 'fence', s(fence))
      redis.call('PEXPIRE', run, ttl)
      return {'granted', fence, tonumber(h[4]), lease_until, page(run, hkey, rid)}
    end
    if h[2] ~= 'running' and h[2] ~= 'interrupted' then
      return {'done', h[2], tonumber(h[4]), h[5] or '', tonumber(h[6]) or 0}
    end
    if h[2] == 'running' and (tonumber(h[3]) > now or takeover_by and now > takeover_by) then
      -- A lease that lapsed while the caller could not reach this server,
      -- or while this call waited in it, may be one whose holder could
      -- not either: its handler may have returned, its release waiting
      -- to land. Held, not taken over, until the caller has heard the
      -- server answer for a lease, and its call did not wait.
      return {'held', h[5] or '', tonumber(h[3]), string.sub(redis.sha1hex(h[1] or ''), 1, 16), tonumber(h[4])}
    end
    base = tonumber(h[7] or h[4])
    attempt = base + 1
    -- A takeover rewrites the hash; a fresh grant creates it.
    redis.call('HDEL', run, 'finished_at')
  end
  local fence = next_fence(fkey)
  redis.call('HSET', run, 'token', token, 'holder', holder, 'fence', s(fence),
    'attempt', s(attempt), 'status', 'running', 'started_at', s(now), 'lease_until', s(lease_until), 'server', id)
  if slots > 1 then
    -- Redlock: this node's grant stands only once committed or renewed
    -- (base is then raised to it); until then a takeover counts on from
    -- base, and an abort goes back to prev, the base it replaced.
    redis.call('HSET', run, 'base', s(base), 'prev', s(base))
  end
  redis.call('PEXPIRE', run, ttl)
  redis.call('SADD', KEYS[1], job)
  if redis.call('ZADD', hkey, at, rid) == 1 then
    -- The history is trimmed back to its limit once it is over by an
    -- eighth, not on every claim: History reads the newest runs only.
    local over = redis.call('ZCARD', hkey) - limit
    if over > math.max(math.floor(limit / 8), 1) then
      redis.call('ZREMRANGEBYRANK', hkey, 0, over - 1)
    end
  end
  return {'granted', fence, attempt, lease_until, page(run, hkey, rid)}
end
local out = {id, now}
for i = 0, (#KEYS - 2) / 3 - 1 do
  local k, a = 3 + 3 * i, 10 + 4 * i
  out[i + 3] = each(grant, KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end
return out
`

// renewBody (renewProgram) extends a live lease held with the token. A claim granted
// by an earlier incarnation of the server (its run came back from disk or
// a replica, which may have missed later writes) is not renewed: its
// holder stands down while the restart guard holds the run. With repair
// on (redlock), a node that lost the claim, or has it only from an earlier
// incarnation, is given it back, with a fresh lease, but says so rather
// than renewed: the holder counts its majority without such nodes.
//
// KEYS: run hash, job fence, job history zset, jobs set.
// ARGV: token, lease ms, done TTL ms, repair ("1" or ""), holder, fence,
// attempt, scheduled ms, run id, job.
// Replies: {"renewed", lease_until_ms}, {"repaired", lease_until_ms} or
// {"lost", reason}.
const renewBody = `
local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'lease_until', 'server', 'attempt')
local id = server()
local now_us = clock()
local now = math.floor(now_us / 1000)
local lease_until = math.ceil(now_us / 1000) + tonumber(ARGV[2]) -- rounded up, as a grant's
local ttl = s(tonumber(ARGV[3]) + tonumber(ARGV[2]))
if ARGV[4] == '1' and (not h[1] or (h[1] == ARGV[1] and h[4] ~= id)) then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[5], 'fence', ARGV[6], 'attempt', ARGV[7],
    'status', 'running', 'started_at', s(now), 'lease_until', s(lease_until), 'server', id)
  redis.call('PEXPIRE', KEYS[1], ttl)
  if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[6]) then
    redis.call('SET', KEYS[2], ARGV[6])
  end
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[9])
  redis.call('SADD', KEYS[4], ARGV[10])
  return {'repaired', lease_until}
end
if not h[1] then return {'lost', 'no such run'} end
if h[1] ~= ARGV[1] then return {'lost', 'taken over'} end
if h[2] ~= 'running' then return {'lost', 'released'} end
if h[4] ~= id then return {'lost', 'server restarted since the grant'} end
if tonumber(h[3]) <= now then return {'lost', 'expired'} end
if ARGV[4] == '1' then
  -- Redlock: a renewal proves the grant stood, on a node its commit may
  -- have missed: a takeover here counts on from its attempt.
  redis.call('HSET', KEYS[1], 'lease_until', s(lease_until), 'base', h[5])
else
  redis.call('HSET', KEYS[1], 'lease_until', s(lease_until))
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {'renewed', lease_until}
`

// releaseScript ends the claims held with the tokens, one script call
// per batch (as claimProgram). Releasing again with the same outcome (a
// client retrying after a lost reply) is a no-op that replies released.
//
// KEYS: per claim: run hash. ARGV: done TTL ms, then per claim: token,
// outcome, "1" if the outcome is terminal.
// Replies, one per claim: {"released"}, {"lost", reason} or {"error",
// message}.
var releaseScript = goredis.NewScript(eachLua + `
local t = redis.call('TIME')
local now = string.format('%.0f', math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000))
local function release(run, token, outcome, terminal)
  local h = redis.call('HMGET', run, 'token', 'status')
  if not h[1] then return {'lost', 'no such run'} end
  if h[1] ~= token then return {'lost', 'taken over'} end
  if h[2] == outcome then return {'released'} end
  if h[2] ~= 'running' then return {'lost', 'released'} end
  redis.call('HSET', run, 'status', outcome)
  if terminal == '1' then
    redis.call('HSET', run, 'finished_at', now)
  end
  redis.call('PEXPIRE', run, ARGV[1])
  return {'released'}
end
local out = {}
for i = 1, #KEYS do
  local a = 2 + 3 * (i - 1)
  out[i] = each(release, KEYS[i], ARGV[a], ARGV[a + 1], ARGV[a + 2])
end
return out
`)

// abortScript undoes a grant nobody will use (a lost quorum, a cancelled
// request): a fresh run disappears, a takeover goes back to the attempt it
// replaced (prev, where a Redlock grant keeps it), ready to be taken over
// at once. Fences are never given back.
//
// KEYS: run hash, job history zset. ARGV: token, run id.
// Reply: 1 if undone, 0 if the token no longer held the run.
var abortScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'token', 'status', 'attempt', 'prev')
if h[1] ~= ARGV[1] or h[2] ~= 'running' then return 0 end
local prev = tonumber(h[4]) or tonumber(h[3]) - 1
if prev < 1 then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
elseif h[4] then
  -- Redlock: back to the attempt the grant replaced, even if its commit
  -- landed before the abort (the caller left, or no validity was left).
  redis.call('HSET', KEYS[1], 'status', 'interrupted', 'attempt', h[4], 'base', h[4])
else
  redis.call('HSET', KEYS[1], 'status', 'interrupted', 'attempt', string.format('%.0f', prev))
end
return 1
`)

// commitScript makes a quorum's decisions durable on one node, one
// script call per batch (as claimProgram): each job's fence key is raised
// to the granted fence, and each run hash (if the token still holds it)
// gets the fence and attempt the quorum agreed on, as its base, so the
// next takeover on any majority counts on from there. A grant never
// committed (its quorum lost, its abort lost or overtaken by the grant
// itself, which a stalled node ran late) leaves base where it was: the
// attempt it took was never started, and spends none of max_attempts
// (an outside review: nodes stalled 3s under a claim round failed a run
// "attempt 2 exceeds max_attempts 1" that never ran).
//
// KEYS: per run: run hash, job fence. ARGV: per run: token, fence, attempt.
// Reply, one per run: 1 if the run hash was updated, 0 if only the fence
// was raised, or {"error", message}.
var commitScript = goredis.NewScript(eachLua + `
local function commit(run, fkey, token, fence, attempt)
  if tonumber(redis.call('GET', fkey) or '0') < tonumber(fence) then
    redis.call('SET', fkey, fence)
  end
  local h = redis.call('HMGET', run, 'token', 'status')
  if h[1] ~= token or h[2] ~= 'running' then return 0 end
  redis.call('HSET', run, 'fence', fence, 'attempt', attempt, 'base', attempt)
  return 1
end
local out = {}
for i = 1, #KEYS / 2 do
  local k, a = 2 * i - 1, 3 * i - 2
  out[i] = each(commit, KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2])
end
return out
`)
