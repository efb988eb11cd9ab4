--[[
  A batch child's run starts (PROTOCOL.md §26.3): it runs only while it holds its job's lock, its parent is live, the
  batch has not stopped, and its outcome is not recorded yet (a child that ran before, or a re-added job). A child
  allowed to run joins the batch's running set.

  Input:
    KEYS[1] task              the parent task hash
    KEYS[2] batch             the batch hash
    KEYS[3] outcomes          the outcome hash
    KEYS[4] running           the running set
    KEYS[5] lock              the child job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] index             the child's index

  Output:
    {R.OK, owner, parentPool}
    {R.TASK_MISSING}          parent (or batch) gone
    {R.TASK_TERMINAL}         parent ended, or the batch stopped
    {R.OUTCOME_RECORDED}
    {R.LOCK_LOST}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local B = {childTool = "childTool", childPool = "childPool", parentPool = "parentPool", size = "size", released = "released", completed = "completed", failed = "failed", failFast = "failFast", concurrency = "concurrency", window = "window", owner = "owner", stopped = "stopped", createdAtMs = "createdAtMs"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end

if not holds_lock(KEYS[5], ARGV[1]) then return {R.LOCK_LOST} end
local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if TERMINAL[status] then return {R.TASK_TERMINAL} end
local v = redis.call('HMGET', KEYS[2], B.owner, B.parentPool, B.stopped)
if not v[2] then return {R.TASK_MISSING} end
if v[3] == '1' then return {R.TASK_TERMINAL} end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then return {R.OUTCOME_RECORDED} end
redis.call('SADD', KEYS[4], ARGV[2])
return {R.OK, v[1] or '', v[2]}
