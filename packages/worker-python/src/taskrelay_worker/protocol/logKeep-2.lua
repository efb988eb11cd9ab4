--[[
  Keeps a run's log lines with its task (PROTOCOL.md §30.4): appended to the task's log stream, at most `maxLen`
  lines (the oldest dropped). Nothing is written for a task that is gone, so no stray stream outlives it; a task that
  has ended has its stream expire with its hash.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] logs              the task's log stream

    ARGV[1] maxLen            the most lines the stream keeps
    ARGV[2] lines             the lines: a JSON array of strings, each a JSON object as text

  Output:
    {R.OK}
    {R.TASK_MISSING}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
for _, line in ipairs(cjson.decode(ARGV[2])) do
  redis.call('XADD', KEYS[2], 'MAXLEN', tonumber(ARGV[1]), '*', 'line', line)
end
if TERMINAL[status] then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then redis.call('PEXPIRE', KEYS[2], left) end
end
return {R.OK}
