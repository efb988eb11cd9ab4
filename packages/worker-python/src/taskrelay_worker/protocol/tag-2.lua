--[[
  A run adds tags to its task (PROTOCOL.md §30.2: `ctx.tag`): merged with the task's, each once, lock-checked,
  refused once the task is terminal or when the task would carry more than `max`. The tags are checked by the caller.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] tags              the tags to add, as a comma list
    ARGV[3] max               the most tags a task carries

  Output:
    {R.OK, tags}              the task's tags now, as a comma list
    {R.LIMIT_FULL, tags}      more than `max` together: nothing written (the task's tags follow)
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

local h = redis.call('HMGET', KEYS[1], F.status, F.tags)
if not h[1] then return {R.TASK_MISSING} end
if TERMINAL[h[1]] then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
local list, seen = {}, {}
for tag in string.gmatch((h[2] or '') .. ',' .. ARGV[2], '[^,]+') do
  if not seen[tag] then
    seen[tag] = true
    list[#list + 1] = tag
  end
end
local joined = table.concat(list, ',')
if #list > tonumber(ARGV[3]) then return {R.LIMIT_FULL, h[2] or ''} end
redis.call('HSET', KEYS[1], F.tags, joined)
return {R.OK, joined}
