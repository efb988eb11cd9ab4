--[[
  Reads a task (PROTOCOL.md §22.5): the whole hash when its result is small, else every field but the result, and the
  result's size. A large result then comes over a connection of its own (`RedisTaskStore` large reads), so it never
  holds the connection every other command of the gateway waits on.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] inlineMax         largest result (bytes) read with the rest

  Output:
    {R.OK, fields, resultBytes}   fields: flat name, value, ...; empty when the task is missing
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

-- Reads a task hash (PROTOCOL.md §22.5): the whole of it when its result is at most `inline_max` bytes, else every
-- field but the result (the big value never leaves Redis in the reply). Returns the flat list and the result's size.
local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local function read_task(key, inline_max)
  local size = redis.call('HSTRLEN', key, F.result)
  if size <= tonumber(inline_max) then return redis.call('HGETALL', key), size end
  local wanted = {}
  for _, name in ipairs(redis.call('HKEYS', key)) do
    if name ~= F.result then wanted[#wanted + 1] = name end
  end
  local flat = {}
  if #wanted > 0 then
    local values = redis.call('HMGET', key, unpack(wanted))
    for i, name in ipairs(wanted) do
      flat[#flat + 1] = name
      flat[#flat + 1] = values[i]
    end
  end
  return flat, size
end

local fields, size = read_task(KEYS[1], ARGV[1])
return {R.OK, fields, size}
