--[[
  A run takes a slot of a per-key concurrency limit (PROTOCOL.md §3.5), or renews the one it holds, or learns that it
  must wait. Holders expire at their lease's end, so a SIGKILLed holder's slot comes back by itself. On a limit shared
  across principals (`principal` given) the line is fair between principals: a principal's n-th waiter in line goes
  after every principal's (n-1)-th (its place: when it first waited + n × FAIR_STRIDE_MS), so one principal's many
  waiting runs do not stand between another principal's first one and the next free slot.

  Input:
    KEYS[1] slots             the limit's holders (sorted set: holder id -> lease end, ms)
    KEYS[2] waiting           its waiting jobs (sorted set: "<queue> <jobId>" -> its place: when it first waited, ms,
                              plus its principal's rank in line × FAIR_STRIDE_MS on a shared limit)
    KEYS[3] waitingBy         the principal of each waiter of a shared limit (hash: "<queue> <jobId>" -> principal)

    ARGV[1] holder            the holder id (the run's job id)
    ARGV[2] limit             at most this many holders
    ARGV[3] leaseMs           a taken or renewed slot's lease
    ARGV[4] waiter            "<queue> <jobId>": what a releaser promotes
    ARGV[5] mode              "take"; "renew": only renews a slot `holder` still holds (a renewal in flight when its run
                              released must not take the slot again); "peek" (after a refused run's delayed move):
                              room takes nothing, no room puts the waiter back in line if it is not there (a releaser
                              that found its job still active may have dropped it), so the next release wakes it
    ARGV[6] principal         the run's principal on a limit shared across principals; '' otherwise (first come,
                              first served)

  Output:
    {R.OK}                    taken or renewed (peek: there is room, nothing written)
    {R.LIMIT_FULL, 0}         renew: `holder` holds no slot (released, or its lease ended)
    {R.LIMIT_FULL, waitMs}    no room: the job is in `waiting` (kept at its first place); waitMs to the earliest lease end
]]
--- @include "resultCodes"
--- @include "redisNow"

local FAIR_STRIDE_MS = 1000000000
local now = redis_now_ms()
local limit = tonumber(ARGV[2])

-- Puts the waiter in line (keeping a place it has): on a shared limit behind every waiter of its principal's.
local function enqueue()
  if redis.call('ZSCORE', KEYS[2], ARGV[4]) then return end
  local place = now
  if ARGV[6] ~= '' then
    local rank = 0
    local line = redis.call('ZRANGE', KEYS[2], 0, -1)
    if #line > 0 then
      for _, p in ipairs(redis.call('HMGET', KEYS[3], unpack(line))) do
        if p == ARGV[6] then rank = rank + 1 end
      end
    end
    place = now + rank * FAIR_STRIDE_MS
    redis.call('HSET', KEYS[3], ARGV[4], ARGV[6])
    redis.call('PEXPIRE', KEYS[3], 86400000)
  end
  redis.call('ZADD', KEYS[2], 'NX', place, ARGV[4])
  redis.call('PEXPIRE', KEYS[2], 86400000)
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
local count = redis.call('ZCARD', KEYS[1])
local mode = ARGV[5]
local leaseMs = tonumber(ARGV[3])
if mode == 'renew' then
  if not held then return {R.LIMIT_FULL, 0} end
  redis.call('ZADD', KEYS[1], now + leaseMs, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], leaseMs * 2)
  return {R.OK}
end
if mode == 'peek' then
  if held or count < limit then return {R.OK} end
  enqueue()
  return {R.LIMIT_FULL, 0}
end
if held or count < limit then
  redis.call('ZADD', KEYS[1], now + leaseMs, ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[4])
  redis.call('HDEL', KEYS[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], leaseMs * 2)
  return {R.OK}
end
enqueue()
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local waitMs = math.max(1, (tonumber(first[2]) or now) - now)
return {R.LIMIT_FULL, waitMs}
