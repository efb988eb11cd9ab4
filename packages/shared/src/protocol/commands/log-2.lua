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
    ARGV[9] publish           the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK}              published
    {R.CHANNEL_FULL}    not published: the gateway's backlog is full (§22.4); counted on the task, and told to the
                        caller with the next message that fits
    {R.UNROUTED}        no gateway holds the caller's session
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

local h = redis.call('HMGET', KEYS[1], F.status, F.gatewayId, F.taskId, F.logsDropped)
if not h[1] then return {R.TASK_MISSING} end
if is_terminal(h[1]) then return {R.TASK_TERMINAL} end
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
local command = publish_command(ARGV[9])
for _, message in ipairs(out) do redis.call(command, channel, message) end
return {R.OK}
