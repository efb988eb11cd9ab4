--[[
  A plain call's retried input round takes its route (PROTOCOL.md §17.3): the gateway serving the retry becomes the
  call's owner (its progress and status events go there), with the retry's progress token. The previous owner is
  kept as a watcher, so it still sees the call end and retires its own route.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] gatewayId         the gateway serving the retry
    ARGV[2] progressToken     the retry's progress token as JSON, or '' for none

  Output:
    {R.OK}
    {R.TASK_MISSING}          no such task, or it is not a plain call
    {R.TASK_TERMINAL, status}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

local h = redis.call('HMGET', KEYS[1], F.mode, F.status, F.gatewayId, F.watchers)
if not h[1] or h[1] ~= 'call' then return {R.TASK_MISSING} end
if TERMINAL[h[2]] then return {R.TASK_TERMINAL, h[2]} end
redis.call('HSET', KEYS[1], F.gatewayId, ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], F.progressToken, ARGV[2])
else
  redis.call('HDEL', KEYS[1], F.progressToken)
end
local old = h[3]
if old and old ~= '' and old ~= ARGV[1] then
  local watchers = h[4]
  local known = false
  if watchers then
    for id in string.gmatch(watchers, '[^,]+') do
      if id == old then known = true end
    end
  end
  if not known then
    redis.call('HSET', KEYS[1], F.watchers, (watchers and watchers ~= '') and (watchers .. ',' .. old) or old)
  end
end
return {R.OK}
