--[[
  Moves a task to a new status when the transition table allows it (PROTOCOL.md §2), publishes the status event,
  and ends the task when the new status is terminal.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] live              the live set
    KEYS[3] lock              the job's lock key (the task key when the write is not a worker's)
    KEYS[4] webhookDue        the webhook outbox's due set (§27.2)
    KEYS[5] webhookPending    the outbox's pending counts per principal
    KEYS[6] webhookDead       the outbox's dead letters
    KEYS[7] retention         the deployment's retention policy (§30.1: status -> ms)

    ARGV[1] to                the new status
    ARGV[2] now               ISO time
    ARGV[3] fields            extra fields, JSON object (statusMessage, result, error, cancelReason)
    ARGV[4] lockToken         the worker's lock token; '' = no lock check
    ARGV[5] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[6] channelSuffix     gateway channel: what comes after it
    ARGV[7] ackTo             gateway to name in the event's ackTo, or ''
    ARGV[8] deadlineAt        the new deadline (ms since epoch), or '' to keep it
    ARGV[9] dropIdempotency   '1' to free the idempotency key at once (the task never ran)
    ARGV[10] eventOutcome     '1' to carry result and error in the terminal event (final = true; §6.7)
    ARGV[11] webhookPrefix    what an outbox event key puts before the event id

  Output:
    {R.OK, to}
    {R.TASK_MISSING}
    {R.LOCK_LOST, current}             another run holds the job
    {R.TASK_TERMINAL, current}         the task has ended already
    {R.TRANSITION_REFUSED, current}    the table does not allow the move
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end

--[[
  The one status write (PROTOCOL.md §2): checks the move against the transition table, generated from
  allowedSources(), and writes the status with its time and any extra fields. Every script that changes a status goes
  through here; none writes the status field itself.

  Returns R.OK when written; R.TASK_MISSING when there is no task (current is false or nil); R.TASK_TERMINAL when the
  task has ended; R.TRANSITION_REFUSED when the table does not allow `to` after `current`.
]]
local SOURCES = {["working"] = {["input_required"] = true}, ["input_required"] = {["working"] = true}, ["completed"] = {["working"] = true, ["input_required"] = true}, ["failed"] = {["working"] = true, ["input_required"] = true}, ["cancelled"] = {["working"] = true, ["input_required"] = true}}
local TERMINAL = {["completed"] = true, ["failed"] = true, ["cancelled"] = true}



local function check_source(current, to)
  if not current then return R.TASK_MISSING end
  local sources = SOURCES[to]
  if sources and sources[current] then return R.OK end
  if TERMINAL[current] then return R.TASK_TERMINAL end
  return R.TRANSITION_REFUSED
end

-- extra: a flat list {field, value, ...} written with the status.
local function move_status(taskKey, current, to, now, extra)
  local code = check_source(current, to)
  if code ~= R.OK then return code end
  local args = {F.status, to, F.lastUpdatedAt, now}
  for i = 1, #extra do args[#args + 1] = extra[i] end
  redis.call('HSET', taskKey, unpack(args))
  return R.OK
end

--[[
  Publishes a status event to the gateway that owns the task and to every watcher, once each (PROTOCOL.md §6, §10.9).
]]

local function publish_status(taskKey, event, channelPrefix, channelSuffix)
  local h = redis.call('HMGET', taskKey, F.gatewayId, F.watchers)
  local payload = cjson.encode(event)
  local sent = {}
  local function send(id)
    if id and id ~= '' and not sent[id] then
      sent[id] = true
      redis.call('PUBLISH', channelPrefix .. id .. channelSuffix, payload)
    end
  end
  send(h[1])
  if h[2] then
    for id in string.gmatch(h[2], '[^,]+') do send(id) end
  end
end

--[[
  Ends a task (PROTOCOL.md §10.1): the hash expires after its ttl, leaves the live set, drops its watchers, and its
  idempotency mapping is kept as long as the task (or freed at once, for a task that never ran); a dedupe mapping
  (§25.2) is freed at once: only an unfinished task is joined. A task (not a plain call) whose ending status has a
  retention in the deployment's policy (`retentionKey`, §30.1) is kept that long instead, and its ttl says so.
]]

local function finish(taskKey, liveKey, taskId, dropIdempotency, status, retentionKey)
  local h = redis.call('HMGET', taskKey, F.ttl, F.idemKey, F.dedupe, F.mode)
  if h[3] == '1' then dropIdempotency = true end
  local ttl = tonumber(h[1]) or 60000
  if h[4] == 'task' then
    local kept = tonumber(redis.call('HGET', retentionKey, status) or '')
    if kept and kept ~= ttl then
      ttl = kept
      redis.call('HSET', taskKey, F.ttl, tostring(kept))
    end
  end
  redis.call('PEXPIRE', taskKey, ttl)
  -- Its stored arguments (§30.2) and its kept log lines (§30.4) go with it: `<P>:task-args:<id>` and
  -- `<P>:task-logs:<id>` beside its `<P>:task:<id>` (keys.ts).
  local base = string.sub(taskKey, 1, #taskKey - #taskId - #'task:')
  redis.call('PEXPIRE', base .. 'task-args:' .. taskId, ttl)
  redis.call('PEXPIRE', base .. 'task-logs:' .. taskId, ttl)
  -- Its output and stored values (§34) are readable only while the task is kept: they go with it when that comes
  -- first (`<P>:output:<id>`, `<P>:blobs:<id>` and each `<P>:blob:<id>:<blobId>` it lists), else at their own TTL.
  local function sooner(key)
    local left = redis.call('PTTL', key)
    if left == -1 or left > ttl then redis.call('PEXPIRE', key, ttl) end
  end
  local blobs = base .. 'blobs:' .. taskId
  for _, blobId in ipairs(redis.call('HKEYS', blobs)) do
    if blobId ~= '\0bytes' then sooner(base .. 'blob:' .. taskId .. ':' .. blobId) end
  end
  sooner(blobs)
  sooner(base .. 'output:' .. taskId)
  redis.call('ZREM', liveKey, taskId)
  redis.call('HDEL', taskKey, F.watchers)
  if h[2] and h[2] ~= '' then
    if dropIdempotency and redis.call('GET', h[2]) == taskId then
      redis.call('DEL', h[2])
    else
      redis.call('PEXPIRE', h[2], ttl)
    end
  end
end

--[[
  Completion webhooks (PROTOCOL.md §27.2): when the task names a webhook, its event joins the outbox in the same script
  as the status write (a move to input_required or a terminal status). Scores are Redis server time, so gateways with
  skewed clocks agree on what is due. An event that would take the principal past the cap the task carries is
  dead-lettered at once. The event hash's own fields (id, url, attempts, ...) are the outbox's, not the task's.
]]

local W = {id = 'id', taskId = 'taskId', principal = 'principal', url = 'url', status = 'status', statusMessage = 'statusMessage', timestamp = 'timestamp', attempts = 'attempts', lease = 'lease', createdAt = 'createdAt', lastError = 'lastError'}
local WEBHOOK_DEAD_LETTERS_KEPT = 1000

-- A webhook event that will not be delivered joins the dead letters, newest first; at most
-- WEBHOOK_DEAD_LETTERS_KEPT are kept (one bound, for the outbox's append and its settle alike).

local function dead_letter(key, letter)
  redis.call('LPUSH', key, cjson.encode(letter))
  redis.call('LTRIM', key, 0, WEBHOOK_DEAD_LETTERS_KEPT - 1)
end

local function outbox_append(taskKey, status, message, timestamp, dueKey, pendingKey, deadKey, eventPrefix)
  local h = redis.call('HMGET', taskKey, F.webhook, F.principal, F.taskId, F.webhookCap)
  if not h[1] or h[1] == '' then return end
  local principal = h[2] or ''
  local n = redis.call('HINCRBY', taskKey, F.webhookSeq, 1)
  local id = 'msg_' .. h[3] .. '_' .. n
  local t = redis.call('TIME')
  local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local cap = tonumber(h[4])
  local held = tonumber(redis.call('HGET', pendingKey, principal)) or 0
  if cap and held >= cap then
    dead_letter(deadKey, {id = id, taskId = h[3], principal = principal, url = h[1], status = status, attempts = 0,
      reason = 'pending cap reached: ' .. held .. ' events of this principal not settled', deadAt = nowMs,
      timestamp = timestamp, statusMessage = (message and message ~= '') and message or nil})
    return
  end
  local fields = {W.id, id, W.taskId, h[3], W.principal, principal, W.url, h[1], W.status, status,
    W.timestamp, timestamp, W.attempts, '0', W.createdAt, tostring(nowMs)}
  if message and message ~= '' then
    fields[#fields + 1] = W.statusMessage
    fields[#fields + 1] = message
  end
  redis.call('HSET', eventPrefix .. id, unpack(fields))
  redis.call('ZADD', dueKey, nowMs, id)
  redis.call('HINCRBY', pendingKey, principal, 1)
end

-- One read of the task's own fields (a Redis command per call counts, issue 46).
local h = redis.call('HMGET', KEYS[1], F.status, F.taskId, F.statusMessage)
local current = h[1]
if not current then return {R.TASK_MISSING} end
if not holds_lock(KEYS[3], ARGV[4]) then return {R.LOCK_LOST, current} end
local extra = cjson.decode(ARGV[3])
local fields = {}
for k, v in pairs(extra) do
  fields[#fields + 1] = k
  fields[#fields + 1] = v
end
if ARGV[8] ~= '' then
  fields[#fields + 1] = F.deadlineAt
  fields[#fields + 1] = ARGV[8]
end
local code = move_status(KEYS[1], current, ARGV[1], ARGV[2], fields)
if code ~= R.OK then return {code, current} end
local taskId = h[2]
local event = {type = 'status', taskId = taskId, status = ARGV[1], lastUpdatedAt = ARGV[2]}
-- The message as the write left it: the one it wrote, else the one the task had.
local message = extra.statusMessage
if message == nil then message = h[3] end
if message and message ~= '' then event.statusMessage = message end
if extra.cancelReason then event.cancelReason = extra.cancelReason end
if ARGV[7] ~= '' then event.ackTo = ARGV[7] end
if ARGV[10] == '1' then
  event.final = true
  event.result = extra.result
  event.error = extra.error
end
publish_status(KEYS[1], event, ARGV[5], ARGV[6])
if TERMINAL[ARGV[1]] or (ARGV[1] == 'input_required' and current ~= 'input_required') then
  outbox_append(KEYS[1], ARGV[1], message, ARGV[2], KEYS[4], KEYS[5], KEYS[6], ARGV[11])
end
if TERMINAL[ARGV[1]] then finish(KEYS[1], KEYS[2], taskId, ARGV[9] == '1', ARGV[1], KEYS[7]) end
return {R.OK, ARGV[1]}
