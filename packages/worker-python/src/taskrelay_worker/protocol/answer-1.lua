--[[
  An answer to input request n (PROTOCOL.md §12.3): accepted only while n is pending. When it was the last one
  pending the task moves back to working through the transition table, with the run deadline (status event);
  otherwise it stays input_required.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] n                 the request number
    ARGV[2] answer            the answer, JSON
    ARGV[3] now               ISO time
    ARGV[4] deadlineAt        the run deadline once resumed, ms since epoch
    ARGV[5] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[6] channelSuffix     gateway channel: what comes after it

  Output:
    {R.OK, queue, resumed}             resumed: 1 when the task is working again, else 0
    {R.INPUT_NOT_PENDING, status}      answered already, never asked, or the task moved on
    {R.TASK_MISSING}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local F = {taskId = "taskId", status = "status", statusMessage = "statusMessage", createdAt = "createdAt", lastUpdatedAt = "lastUpdatedAt", ttl = "ttl", pollInterval = "pollInterval", tool = "tool", queue = "queue", principal = "principal", mode = "mode", sessionId = "sessionId", gatewayId = "gatewayId", progressToken = "progressToken", progress = "progress", total = "total", progressMessage = "progressMessage", logsDropped = "logsDropped", result = "result", error = "error", cancelReason = "cancelReason", deadlineAt = "deadlineAt", attempt = "attempt", toolVersion = "toolVersion", backOff = "backOff", startedAt = "startedAt", idemKey = "idemKey", dedupe = "dedupe", clientCaps = "clientCaps", state = "state", steps = "steps", inputFloor = "inputFloor", pendingInput = "pendingInput", watchers = "watchers", webhook = "webhook", webhookCap = "webhookCap", webhookSeq = "webhookSeq", tags = "tags", replayOf = "replayOf", replayedBy = "replayedBy", input = "input:", answer = "answer:", waitpoint = "wp:"}

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

local h = redis.call('HMGET', KEYS[1], F.status, F.pendingInput, F.taskId, F.queue)
if not h[1] then return {R.TASK_MISSING} end
-- Only a task waiting for input may take an answer: the one status that may move back to working.
if check_source(h[1], 'working') ~= R.OK or redis.call('HEXISTS', KEYS[1], F.answer .. ARGV[1]) == 1 then
  return {R.INPUT_NOT_PENDING, h[1]}
end
local rest = {}
local found = false
for id in string.gmatch(h[2] or '', '[^,]+') do
  if id == ARGV[1] then found = true else rest[#rest + 1] = id end
end
if not found then return {R.INPUT_NOT_PENDING, h[1]} end
if #rest > 0 then
  redis.call('HSET', KEYS[1], F.answer .. ARGV[1], ARGV[2], F.lastUpdatedAt, ARGV[3], F.pendingInput,
    table.concat(rest, ','))
  return {R.OK, h[4] or '', 0}
end
move_status(KEYS[1], h[1], 'working', ARGV[3], {F.answer .. ARGV[1], ARGV[2], F.deadlineAt, ARGV[4]})
redis.call('HDEL', KEYS[1], F.pendingInput)
publish_status(KEYS[1], {type = 'status', taskId = h[3], status = 'working', lastUpdatedAt = ARGV[3]}, ARGV[5],
  ARGV[6])
return {R.OK, h[4] or '', 1}
