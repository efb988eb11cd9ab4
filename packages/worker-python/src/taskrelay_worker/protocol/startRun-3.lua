--[[
  A run starts (PROTOCOL.md §10.2): the lock holder records the attempt and moves the deadline. A terminal task is
  returned as it is, unchanged and without a lock check (the run then ends without running the tool). Unless the
  lock is another run's, the job leaves its principal's waiting share of the pool (§25) in the same step: it is
  taken, whatever happens next.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key
    KEYS[3] share             the principal's fair share of the pool (the task key when the job names no principal)

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] deadlineAt        the run's deadline, ms since epoch
    ARGV[3] now               ISO time
    ARGV[4] attempt           the run's number
    ARGV[5] jobId             the job's id in the share

  Output:
    {R.OK, hash}        the hash as a flat list
    {R.TASK_MISSING}
    {R.LOCK_LOST}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", input = "input:", answer = "answer:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end

local function leave_share()
  if KEYS[3] ~= KEYS[1] then redis.call('ZREM', KEYS[3], ARGV[5]) end
end

local status = redis.call('HGET', KEYS[1], F.status)
if not status then
  leave_share()
  return {R.TASK_MISSING}
end
if not TERMINAL[status] then
  if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
  -- A run replaying while its input request is still pending keeps the input deadline (§12.2).
  if status ~= 'input_required' then redis.call('HSET', KEYS[1], F.deadlineAt, ARGV[2]) end
  redis.call('HSET', KEYS[1], F.attempt, ARGV[4])
  -- A back-off is over once a run starts (§3.4): its message goes with it.
  if redis.call('HDEL', KEYS[1], F.backOff) == 1 then redis.call('HDEL', KEYS[1], F.statusMessage) end
  if redis.call('HEXISTS', KEYS[1], F.startedAt) == 0 then redis.call('HSET', KEYS[1], F.startedAt, ARGV[3]) end
end
leave_share()
return {R.OK, redis.call('HGETALL', KEYS[1])}
