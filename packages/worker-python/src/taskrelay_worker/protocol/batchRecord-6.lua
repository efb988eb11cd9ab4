--[[
  A batch child's outcome (PROTOCOL.md §26.3), recorded exactly once: only by the run holding the child's job lock,
  and only the first time (HSETNX), so a child that ran twice (a stall, a crash after the tool returned) is counted
  once. The first record counts it, takes it out of the open and running sets and the principal's open work, and
  says whether this record should wake the parent (§26.4).

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] outcomes          the outcome hash
    KEYS[3] open              the open set (released, unrecorded)
    KEYS[4] running           the running set
    KEYS[5] lock              the child job's lock key
    KEYS[6] principalOpen     the principal's open-work set (the open-task cap, §25)

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] index             the child's index
    ARGV[3] childId           the child's job id (its member in principalOpen)
    ARGV[4] failed            "1" for a failure, "0" for a completion
    ARGV[5] outcome           the outcome, JSON

  Output:
    {R.OK, done, size, failed, wake, below}
                                          wake: "1" when this record should promote the parent (the crossing);
                                          below: "1" while the parent should run (§26.4's condition), crossed or not
    {R.OUTCOME_RECORDED}
    {R.TASK_MISSING}                      the batch is gone
    {R.LOCK_LOST}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local B = {childTool = "childTool", childPool = "childPool", parentPool = "parentPool", size = "size", released = "released", completed = "completed", failed = "failed", failFast = "failFast", concurrency = "concurrency", window = "window", owner = "owner", stopped = "stopped", createdAtMs = "createdAtMs"}

--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end

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

if not holds_lock(KEYS[5], ARGV[1]) then return {R.LOCK_LOST} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {R.TASK_MISSING} end
local first = redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[5])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[6], ARGV[3])
if first == 0 then return {R.OUTCOME_RECORDED} end
local failure = ARGV[4] == '1'
if failure then redis.call('HINCRBY', KEYS[1], B.failed, 1)
else redis.call('HINCRBY', KEYS[1], B.completed, 1) end
local s = batch_state(KEYS[1], KEYS[3])
local wake, below = '0', '0'
if batch_crossed(s, failure) then wake = '1' end
if s.wake then below = '1' end
return {R.OK, s.done, s.size, s.failed, wake, below}
