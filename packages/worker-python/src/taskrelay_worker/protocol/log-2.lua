--[[
  A tool's log message (PROTOCOL.md §15): published on the owning gateway's channel, never stored. The payload is
  built here around the caller's JSON so the data is not decoded and encoded again.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key (the task key when the write is not a worker's)

    ARGV[1] level             the MCP log level
    ARGV[2] data              the data, JSON
    ARGV[3] logger            the logger name as a JSON string, or ''
    ARGV[4] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[5] channelSuffix     gateway channel: what comes after it
    ARGV[6] lockToken         the worker's lock token; '' = no lock check

  Output:
    {R.OK}              published
    {R.UNROUTED}        no gateway holds the caller's session
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}

--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end

local h = redis.call('HMGET', KEYS[1], F.status, F.gatewayId, F.taskId)
if not h[1] then return {R.TASK_MISSING} end
if TERMINAL[h[1]] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[6]) then return {R.LOCK_LOST} end
if not h[2] or h[2] == '' then return {R.UNROUTED} end
local payload = '{"type":"log","taskId":' .. cjson.encode(h[3]) .. ',"level":' .. cjson.encode(ARGV[1]) ..
  ',"data":' .. ARGV[2]
if ARGV[3] ~= '' then payload = payload .. ',"logger":' .. ARGV[3] end
redis.call('PUBLISH', ARGV[4] .. h[2] .. ARGV[5], payload .. '}')
return {R.OK}
