--[[
  A run writes its task's partial output (PROTOCOL.md §34.2): appends or replaces, keeps the newest maxBytes (cut on
  a UTF-8 character boundary), refreshes the key's expiry, and wakes the gateways' resource subscriptions.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key (the task key when the write is not a worker's)
    KEYS[3] output            the output string

    ARGV[1] lockToken         the worker's lock token; '' = no lock check
    ARGV[2] mode              'append' or 'set'
    ARGV[3] chunk             the text (UTF-8)
    ARGV[4] maxBytes          the most bytes the output keeps (its tail)
    ARGV[5] ttlMs             the output key's expiry after this write
    ARGV[6] channel           the resources channel
    ARGV[7] taskId            the task id, published on the channel

  Output:
    {R.OK, length}      written; the output's length in bytes
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

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if TERMINAL[status] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
local max = tonumber(ARGV[4])
local text
if ARGV[2] == 'append' then
  local length = redis.call('APPEND', KEYS[3], ARGV[3])
  if length > max then text = redis.call('GET', KEYS[3]) end
else
  text = ARGV[3]
  if #text <= max then redis.call('SET', KEYS[3], text) end
end
if text and #text > max then
  -- The tail is kept; UTF-8 continuation bytes (0x80..0xBF) at its start belong to a character cut off: dropped.
  local from = #text - max + 1
  while from <= #text do
    local b = string.byte(text, from)
    if b < 128 or b > 191 then break end
    from = from + 1
  end
  redis.call('SET', KEYS[3], string.sub(text, from))
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
redis.call('PUBLISH', ARGV[6], cjson.encode({taskId = ARGV[7]}))
return {R.OK, redis.call('STRLEN', KEYS[3])}
