--[[
  A parent's first `ctx.fanOut` stores its batch (PROTOCOL.md §26.2): the batch hash and the item list, once. A replay
  of the parent finds the batch there and writes nothing. Lock-checked: only the run holding the parent's job.

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] items             the item list
    KEYS[3] lock              the parent job's lock key
    KEYS[4] task              the parent task hash

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] fields            JSON object: batch field -> value
    ARGV[3] items             the items' JSON texts, joined by "\n" (JSON text never holds a raw newline)
    ARGV[4] ttlMs             how long the batch keys live (renewed when the batch ends)

  Output:
    {R.OK}
    {R.BATCH_EXISTS}
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

local status = redis.call('HGET', KEYS[4], F.status)
if not status then return {R.TASK_MISSING} end
if TERMINAL[status] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[3], ARGV[1]) then return {R.LOCK_LOST} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {R.BATCH_EXISTS} end

local fields = cjson.decode(ARGV[2])
for name, value in pairs(fields) do
  redis.call('HSET', KEYS[1], name, tostring(value))
end
local chunk = {}
for item in string.gmatch(ARGV[3], '[^\n]+') do
  chunk[#chunk + 1] = item
  if #chunk == 1000 then
    redis.call('RPUSH', KEYS[2], unpack(chunk))
    chunk = {}
  end
end
if #chunk > 0 then redis.call('RPUSH', KEYS[2], unpack(chunk)) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {R.OK}
