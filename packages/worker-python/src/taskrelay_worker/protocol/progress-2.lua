--[[
  Records a run's progress on the task and wakes the gateway that routes it (PROTOCOL.md §6). Progress only grows.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key (the task key when the write is not a worker's)

    ARGV[1] progress          the new progress value
    ARGV[2] total             the total, or '' for none
    ARGV[3] message           the message as a JSON string, or '' for none
    ARGV[4] now               ISO time
    ARGV[5] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[6] channelSuffix     gateway channel: what comes after it
    ARGV[7] lockToken         the worker's lock token; '' = no lock check
    ARGV[8] backlogPrefix     gateway backlog hash: what comes before the gateway id (§22.4)
    ARGV[9] backlogSuffix     gateway backlog hash: what comes after it

  Output:
    {R.OK}               recorded, and published unless the gateway's backlog is full (§22.4: the hash has it)
    {R.PROGRESS_STALE}   not above the last value
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

local h = redis.call('HMGET', KEYS[1], F.status, F.progress, F.gatewayId, F.taskId, F.total)
if not h[1] then return {R.TASK_MISSING} end
if TERMINAL[h[1]] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[7]) then return {R.LOCK_LOST} end
local progress = tonumber(ARGV[1])
if h[2] and tonumber(h[2]) >= progress then return {R.PROGRESS_STALE} end
local event = {type = 'progress', taskId = h[4], progress = progress}
-- One HSET for every field the update writes (a Redis command per call counts, issue 46).
local fields = {F.progress, ARGV[1], F.lastUpdatedAt, ARGV[4]}
if ARGV[2] ~= '' then
  fields[#fields + 1] = F.total
  fields[#fields + 1] = ARGV[2]
  event.total = tonumber(ARGV[2])
elseif h[5] then
  redis.call('HDEL', KEYS[1], F.total)
end
if ARGV[3] ~= '' then
  local message = cjson.decode(ARGV[3])
  fields[#fields + 1] = F.progressMessage
  fields[#fields + 1] = message
  fields[#fields + 1] = F.statusMessage
  fields[#fields + 1] = message
  event.message = message
end
redis.call('HSET', KEYS[1], unpack(fields))
if h[3] and h[3] ~= '' then
  local channel = ARGV[5] .. h[3] .. ARGV[6]
  local payload = cjson.encode(event)
  if backlog_admit(h[3], channel, {payload}, ARGV[8], ARGV[9]) then redis.call('PUBLISH', channel, payload) end
end
return {R.OK}
