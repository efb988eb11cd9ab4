--[[
  A tool's log message (PROTOCOL.md §15): published on the owning gateway's channel, never stored, when it fits the
  gateway's backlog (§22.4). The payload is built here around the caller's JSON so the data is not decoded and encoded
  again. Messages that did not fit are counted on the task (`logsDropped`), and the next one that fits is preceded by
  a `warning` from logger `taskrelay` saying how many.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key (the task key when the write is not a worker's)

    ARGV[1] level             the MCP log level
    ARGV[2] data              the data, JSON
    ARGV[3] logger            the logger name as a JSON string, or ''
    ARGV[4] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[5] channelSuffix     gateway channel: what comes after it
    ARGV[6] lockToken         the worker's lock token; '' = no lock check
    ARGV[7] backlogPrefix     gateway backlog hash: what comes before the gateway id (§22.4)
    ARGV[8] backlogSuffix     gateway backlog hash: what comes after it

  Output:
    {R.OK}              published
    {R.CHANNEL_FULL}    not published: the gateway's backlog is full (§22.4); counted on the task, and told to the
                        caller with the next message that fits
    {R.UNROUTED}        no gateway holds the caller's session
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
  The bound on what waits for one gateway on its channel (PROTOCOL.md §22.4). Each gateway keeps a hash
  `<backlogPrefix><gatewayId><backlogSuffix>` = {max, bytes}: `max` is its budget (below Redis's pub/sub output limit),
  `bytes` what tool messages published to it and not yet read add up to; it acknowledges what it reads. A tool message
  (progress, log) is published only when it fits: `backlog_admit` counts it and answers true, or answers false and
  counts nothing. A gateway without the hash (gone: it expires a minute after the gateway stops refreshing it) bounds
  nothing: nobody reads its channel, so Redis buffers nothing for it.
]]

-- As BACKLOG_MESSAGE_OVERHEAD in channel-backlog.ts: RESP framing besides the payload and the channel name.
local BACKLOG_MESSAGE_OVERHEAD = 64

-- `payloads` (a list) go out together or not at all.
local function backlog_admit(gatewayId, channel, payloads, backlogPrefix, backlogSuffix)
  local key = backlogPrefix .. gatewayId .. backlogSuffix
  local b = redis.call('HMGET', key, 'max', 'bytes')
  if not b[1] then return true end
  local cost = 0
  for _, payload in ipairs(payloads) do cost = cost + #payload + #channel + BACKLOG_MESSAGE_OVERHEAD end
  if (tonumber(b[2]) or 0) + cost > tonumber(b[1]) then return false end
  redis.call('HINCRBY', key, 'bytes', cost)
  return true
end

local h = redis.call('HMGET', KEYS[1], F.status, F.gatewayId, F.taskId, F.logsDropped)
if not h[1] then return {R.TASK_MISSING} end
if TERMINAL[h[1]] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[6]) then return {R.LOCK_LOST} end
if not h[2] or h[2] == '' then return {R.UNROUTED} end
local channel = ARGV[4] .. h[2] .. ARGV[5]
local head = '{"type":"log","taskId":' .. cjson.encode(h[3]) .. ',"level":'
local payload = head .. cjson.encode(ARGV[1]) .. ',"data":' .. ARGV[2]
if ARGV[3] ~= '' then payload = payload .. ',"logger":' .. ARGV[3] end
payload = payload .. '}'
local dropped = tonumber(h[4]) or 0
local out = {payload}
if dropped > 0 then
  out = {head .. '"warning","logger":"taskrelay","data":' .. cjson.encode({
    dropped = dropped,
    reason = 'log messages were dropped: the gateway had too much unread on its channel',
  }) .. '}', payload}
end
if not backlog_admit(h[2], channel, out, ARGV[7], ARGV[8]) then
  redis.call('HINCRBY', KEYS[1], F.logsDropped, 1)
  return {R.CHANNEL_FULL}
end
if dropped > 0 then redis.call('HDEL', KEYS[1], F.logsDropped) end
for _, message in ipairs(out) do redis.call('PUBLISH', channel, message) end
return {R.OK}
