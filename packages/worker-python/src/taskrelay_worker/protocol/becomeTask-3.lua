--[[
  A plain call becomes a task (PROTOCOL.md §17.4): an `inputFirst` tool's call, whose input rounds are answered,
  turns into a task of its principal. Only a call that is not terminal moves; its ttl becomes the task's, and it
  joins the principal's index and the operators' task index (§30.2) so it is listed from then on. Its arguments are not
  kept (a replay of it answers that it has none, §30.3).

  Input:
    KEYS[1] task              the task hash
    KEYS[2] principalIndex    the principal's task-mode index (sorted set)
    KEYS[3] taskIndex         every task-mode task, scored by creation time

    ARGV[1] ttl               the ttl granted to the task, ms
    ARGV[2] indexCap          how many ids the index keeps
    ARGV[3] indexTtlMs        the index expires this long after its last addition
    ARGV[4] taskId            the task's id
    ARGV[5] createdAtMs       the task's creation time, ms since epoch (the index score)

  Output:
    {R.OK}
    {R.TASK_MISSING}          no such task, or it is not a plain call
    {R.TASK_TERMINAL, status}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

local h = redis.call('HMGET', KEYS[1], F.mode, F.status)
if not h[1] or h[1] ~= 'call' then return {R.TASK_MISSING} end
if TERMINAL[h[2]] then return {R.TASK_TERMINAL, h[2]} end
redis.call('HSET', KEYS[1], F.mode, 'task', F.ttl, ARGV[1])
redis.call('ZADD', KEYS[2], tonumber(ARGV[5]), ARGV[4])
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[4])
local cap = tonumber(ARGV[2])
if redis.call('ZCARD', KEYS[2]) > cap then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(cap + 1)) end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
return {R.OK}
