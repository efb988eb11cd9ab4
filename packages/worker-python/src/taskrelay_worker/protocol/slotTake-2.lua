--[[
  A run takes a slot of a per-key concurrency limit (PROTOCOL.md §3.5), or renews the one it holds, or learns that it
  must wait. Holders expire at their lease's end, so a SIGKILLed holder's slot comes back by itself.

  Input:
    KEYS[1] slots             the limit's holders (sorted set: holder id -> lease end, ms)
    KEYS[2] waiting           its waiting jobs (sorted set: "<queue> <jobId>" -> when it first waited, ms)

    ARGV[1] holder            the holder id (the run's job id)
    ARGV[2] limit             at most this many holders
    ARGV[3] leaseMs           a taken or renewed slot's lease
    ARGV[4] waiter            "<queue> <jobId>": what a releaser promotes
    ARGV[5] mode              "take"; "renew": only renews a slot `holder` still holds (a renewal in flight when its run
                              released must not take the slot again); "peek" (after a refused run's delayed move):
                              room takes nothing, no room puts the waiter back in line if it is not there (a releaser
                              that found its job still active may have dropped it), so the next release wakes it

  Output:
    {R.OK}                    taken or renewed (peek: there is room, nothing written)
    {R.LIMIT_FULL, 0}         renew: `holder` holds no slot (released, or its lease ended)
    {R.LIMIT_FULL, waitMs}    no room: the job is in `waiting` (kept at its first place); waitMs to the earliest lease end
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

--[[
  Redis' own clock in ms: the one clock every worker of a limit agrees on (PROTOCOL.md §3.5), whatever its host's.
]]

local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local now = redis_now_ms()
local limit = tonumber(ARGV[2])
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
  redis.call('ZADD', KEYS[2], 'NX', now, ARGV[4])
  redis.call('PEXPIRE', KEYS[2], 86400000)
  return {R.LIMIT_FULL, 0}
end
if held or count < limit then
  redis.call('ZADD', KEYS[1], now + leaseMs, ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[4])
  redis.call('PEXPIRE', KEYS[1], leaseMs * 2)
  return {R.OK}
end
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[4])
redis.call('PEXPIRE', KEYS[2], 86400000)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local waitMs = math.max(1, (tonumber(first[2]) or now) - now)
return {R.LIMIT_FULL, waitMs}
