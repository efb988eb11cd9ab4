--[[
  A back-off holds a rate limit (PROTOCOL.md §3.4, §3.5): no start until now + ms, for every tool that shares it. A
  longer hold already there is kept.

  Input:
    KEYS[1] hold              held until (ms)

    ARGV[1] ms                hold this long from now

  Output:
    {R.OK, until}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

--[[
  Redis' own clock in ms: the one clock every worker of a limit agrees on (PROTOCOL.md §3.5), whatever its host's.
]]

local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local ms = tonumber(ARGV[1])
local untilMs = redis_now_ms() + ms
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if held >= untilMs then return {R.OK, held} end
redis.call('SET', KEYS[1], untilMs, 'PX', ms)
return {R.OK, untilMs}
