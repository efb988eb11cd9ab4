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
    ARGV[10] publish          the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK}               recorded, and published unless the gateway's backlog is full (§22.4: the hash has it)
    {R.PROGRESS_STALE}   not above the last value
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"
--- @include "channelBacklog"
--- @include "publishCommand"

local h = redis.call('HMGET', KEYS[1], F.status, F.progress, F.gatewayId, F.taskId, F.total)
if not h[1] then return {R.TASK_MISSING} end
if is_terminal(h[1]) then return {R.TASK_TERMINAL} end
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
  if backlog_admit(h[3], channel, {payload}, ARGV[8], ARGV[9]) then redis.call(publish_command(ARGV[10]), channel, payload) end
end
return {R.OK}
