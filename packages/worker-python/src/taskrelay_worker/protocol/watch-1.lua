--[[
  Reads a task and, while it is not terminal, registers a gateway to be told of its status changes: a waiter on
  another gateway than the owner (PROTOCOL.md §10.9).

  Input:
    KEYS[1] task              the task hash

    ARGV[1] gatewayId         the waiting gateway
    ARGV[2] inlineMax         largest result (bytes) read with the rest; a larger one is left out (§22.5)

  Output:
    {R.OK, hash, resultBytes}   the hash as a flat list, without a result over inlineMax
    {R.TASK_MISSING}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

-- Reads a task hash (PROTOCOL.md §22.5): the whole of it when its result is at most `inline_max` bytes, else every
-- field but the result (the big value never leaves Redis in the reply). Returns the flat list and the result's size.

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

local h, size = read_task(KEYS[1], ARGV[2])
if #h == 0 then return {R.TASK_MISSING} end
local status, owner, watchers
for i = 1, #h, 2 do
  if h[i] == F.status then status = h[i + 1] elseif h[i] == F.gatewayId then owner = h[i + 1]
  elseif h[i] == F.watchers then watchers = h[i + 1] end
end
if TERMINAL[status] or owner == ARGV[1] then return {R.OK, h, size} end
if watchers then
  for id in string.gmatch(watchers, '[^,]+') do
    if id == ARGV[1] then return {R.OK, h, size} end
  end
  redis.call('HSET', KEYS[1], F.watchers, watchers .. ',' .. ARGV[1])
else
  redis.call('HSET', KEYS[1], F.watchers, ARGV[1])
end
return {R.OK, h, size}
