--[[
  A batch's counters and whether its parent should run now (PROTOCOL.md §26.4, §26.5), in one read.

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] open              the open set

  Output:
    {R.OK, size, completed, failed, released, open, window, stopped, wake}   stopped, wake: "1" or "0"
    {R.TASK_MISSING}                                                        no such batch
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local B = {childTool = "childTool", childPool = "childPool", parentPool = "parentPool", size = "size", released = "released", completed = "completed", failed = "failed", failFast = "failFast", concurrency = "concurrency", window = "window", owner = "owner", stopped = "stopped", createdAtMs = "createdAtMs"}

--[[
  A batch's counters, and whether its parent should run now (PROTOCOL.md §26.4): every child is recorded, fail-fast
  tripped, or at most half a window is still in flight while children remain to release. `batch_state` answers the
  condition as it stands (the parent's own check after it suspends); the child that records an outcome promotes the
  parent only when its record makes the condition true (`batch_crossed`), so one window wakes the parent once.
]]

local function batch_state(batchKey, openKey)
  local v = redis.call('HMGET', batchKey, B.size, B.completed, B.failed, B.released, B.window, B.failFast, B.stopped)
  local s = {
    size = tonumber(v[1]) or 0,
    completed = tonumber(v[2]) or 0,
    failed = tonumber(v[3]) or 0,
    released = tonumber(v[4]) or 0,
    window = tonumber(v[5]) or 1,
    failFast = v[6] == '1',
    stopped = v[7] == '1',
    open = redis.call('SCARD', openKey),
  }
  s.done = s.completed + s.failed
  local wake = false
  if s.done >= s.size then wake = true
  elseif s.failFast and s.failed > 0 then wake = true
  elseif s.released < s.size and s.open <= math.floor(s.window / 2) then wake = true end
  s.wake = wake and not s.stopped
  return s
end

local function batch_crossed(s, recordedFailure)
  if s.stopped then return false end
  if s.done >= s.size then return true end
  if s.failFast and recordedFailure and s.failed == 1 then return true end
  return s.released < s.size and s.open == math.floor(s.window / 2)
end

if redis.call('EXISTS', KEYS[1]) == 0 then return {R.TASK_MISSING} end
local s = batch_state(KEYS[1], KEYS[2])
local stopped, wake = '0', '0'
if s.stopped then stopped = '1' end
if s.wake then wake = '1' end
return {R.OK, s.size, s.completed, s.failed, s.released, s.open, s.window, stopped, wake}
