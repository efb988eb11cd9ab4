--[[
  A run suspends (PROTOCOL.md §12): lock-checked. With input requests (one or several asked at once) it stores each
  one not yet answered, adds it to the pending list, moves the task to input_required through the transition table
  (a status event carrying inputRequestId, the newly pending numbers) and sets the input deadline. Requests already
  answered are returned instead. A timed suspension only moves the deadline, and sets the status message when one is
  given (a back-off, §3.4: the task stays working and says why and until when).

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key
    KEYS[3] webhookDue        the webhook outbox's due set (§27.2)
    KEYS[4] webhookPending    the outbox's pending counts per principal
    KEYS[5] webhookDead       the outbox's dead letters

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] requests          JSON [[n, requestJSON], ...], or '' for a timed suspension
    ARGV[3] now               ISO time
    ARGV[4] deadlineAt        the deadline while suspended, ms since epoch
    ARGV[5] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[6] channelSuffix     gateway channel: what comes after it
    ARGV[7] webhookPrefix     what an outbox event key puts before the event id
    ARGV[8] statusMessage     a timed suspension's status message, or '' to leave it

  Output:
    {R.OK, answers}                    answers: flat {n, answerJSON, ...} of the requests already answered
    {R.TASK_MISSING}
    {R.TASK_TERMINAL, status}
    {R.TRANSITION_REFUSED, status}
    {R.LOCK_LOST}
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

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if TERMINAL[status] then return {R.TASK_TERMINAL, status} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
if ARGV[2] == '' then
  redis.call('HSET', KEYS[1], F.deadlineAt, ARGV[4])
  if ARGV[8] ~= '' then
    redis.call('HSET', KEYS[1], F.statusMessage, ARGV[8], F.lastUpdatedAt, ARGV[3], F.backOff, '1')
  end
  return {R.OK, {}}
end
local requests = cjson.decode(ARGV[2])
local pendingRaw = redis.call('HGET', KEYS[1], F.pendingInput) or ''
local pending = {}
local order = {}
for id in string.gmatch(pendingRaw, '[^,]+') do
  pending[id] = true
  order[#order + 1] = id
end
local answers = {}
local added = {}
for _, r in ipairs(requests) do
  local n = tostring(r[1])
  local answer = redis.call('HGET', KEYS[1], F.answer .. n)
  if answer then
    answers[#answers + 1] = n
    answers[#answers + 1] = answer
  elseif not pending[n] then
    pending[n] = true
    order[#order + 1] = n
    added[#added + 1] = {n, r[2]}
  end
end
if #added > 0 then
  local fields = {F.pendingInput, table.concat(order, ','), F.deadlineAt, ARGV[4]}
  local ids = {}
  for _, a in ipairs(added) do
    fields[#fields + 1] = F.input .. a[1]
    fields[#fields + 1] = a[2]
    ids[#ids + 1] = a[1]
  end
  if status == 'input_required' then
    -- Already waiting for an answer: more requests join the wait; the status stays, so no move.
    redis.call('HSET', KEYS[1], F.lastUpdatedAt, ARGV[3], unpack(fields))
  else
    local code = move_status(KEYS[1], status, 'input_required', ARGV[3], fields)
    if code ~= R.OK then return {code, status} end
  end
  local taskId = redis.call('HGET', KEYS[1], F.taskId)
  local event = {type = 'status', taskId = taskId, status = 'input_required', lastUpdatedAt = ARGV[3],
    inputRequestId = table.concat(ids, ',')}
  local message = redis.call('HGET', KEYS[1], F.statusMessage)
  if message and message ~= '' then event.statusMessage = message end
  publish_status(KEYS[1], event, ARGV[5], ARGV[6])
  -- Another question while the task already waits is no status change: no second webhook event.
  if status ~= 'input_required' then
    outbox_append(KEYS[1], 'input_required', message, ARGV[3], KEYS[3], KEYS[4], KEYS[5], ARGV[7])
  end
end
return {R.OK, answers}
