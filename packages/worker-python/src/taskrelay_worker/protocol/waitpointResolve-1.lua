--[[
  A waitpoint's URL was called (PROTOCOL.md §32.4): stores the body as its value, once. Only while the task exists,
  holds this very token under `field`, has not ended, and the waitpoint waits and is not past its `timeoutAt` (Redis'
  clock); a waitpoint called already answers so even once its task has ended. The value is stored as the caller's JSON text, never decoded and re-encoded here.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] field             the waitpoint's field, `wp:<name>`
    ARGV[2] token             the token the URL carried
    ARGV[3] value             the body, JSON text (checked by the caller)

  Output:
    {R.OK, queue}             stored: the task's job queue follows (the caller promotes the job)
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.WAITPOINT_UNKNOWN}     no such waitpoint with that token
    {R.WAITPOINT_USED}        called already
    {R.WAITPOINT_EXPIRED}     timed out
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

--[[
  Redis' own clock in ms: the one clock every worker of a limit agrees on (PROTOCOL.md §3.5), whatever its host's.
]]

local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local h = redis.call('HMGET', KEYS[1], F.status, F.queue, ARGV[1])
if not h[1] then return {R.TASK_MISSING} end
if not h[3] then return {R.WAITPOINT_UNKNOWN} end
local wp = cjson.decode(h[3])
if wp.token ~= ARGV[2] then return {R.WAITPOINT_UNKNOWN} end
-- Called twice says so, whether or not the task has ended since.
if wp.state == 'completed' then return {R.WAITPOINT_USED} end
if TERMINAL[h[1]] then return {R.TASK_TERMINAL} end
local now = redis_now_ms()
if wp.state ~= 'waiting' or now >= wp.timeoutAt then return {R.WAITPOINT_EXPIRED} end
redis.call('HSET', KEYS[1], ARGV[1], '{"token":' .. cjson.encode(wp.token) .. ',"timeoutAt":' ..
  string.format('%d', wp.timeoutAt) .. ',"state":"completed","completedAt":' .. string.format('%d', now) ..
  ',"value":' .. ARGV[3] .. '}')
return {R.OK, h[2] or ''}
