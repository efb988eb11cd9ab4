--[[
  A run opens a waitpoint (PROTOCOL.md §32.1), lock-checked. The first run that opens `field` stores `record` (its
  token, `state: "waiting"`, and `timeoutAt` = Redis' clock + timeoutMs); every later run gets the stored one back, so
  the URL is the same on every run of the task. A waiting one whose `timeoutAt` has passed is ended here (`timedOut`),
  atomically, so a callback after the timeout is refused.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] field             the waitpoint's field, `wp:<name>`
    ARGV[3] token             the token a new waitpoint gets
    ARGV[4] timeoutMs         how long a new waitpoint waits

  Output:
    {R.OK, record}            the waitpoint as stored: JSON {token, timeoutAt, state[, completedAt, value]}
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end

--[[
  Redis' own clock in ms: the one clock every worker of a limit agrees on (PROTOCOL.md §3.5), whatever its host's.
]]

local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if TERMINAL[status] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
local now = redis_now_ms()
local stored = redis.call('HGET', KEYS[1], ARGV[2])
if not stored then
  -- Built as text: cjson would print a 13-digit time in exponent form.
  stored = '{"token":' .. cjson.encode(ARGV[3]) .. ',"timeoutAt":' .. string.format('%d', now + tonumber(ARGV[4])) ..
    ',"state":"waiting"}'
  redis.call('HSET', KEYS[1], ARGV[2], stored)
  return {R.OK, stored}
end
local wp = cjson.decode(stored)
if wp.state == 'waiting' and now >= wp.timeoutAt then
  stored = '{"token":' .. cjson.encode(wp.token) .. ',"timeoutAt":' .. string.format('%d', wp.timeoutAt) ..
    ',"state":"timedOut"}'
  redis.call('HSET', KEYS[1], ARGV[2], stored)
end
return {R.OK, stored}
