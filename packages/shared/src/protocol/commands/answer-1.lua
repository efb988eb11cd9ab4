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
    ARGV[7] publish           the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK, queue, resumed}             resumed: 1 when the task is working again, else 0
    {R.INPUT_NOT_PENDING, status}      answered already, never asked, or the task moved on
    {R.TASK_MISSING}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "moveStatus"
--- @include "publishStatus"

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
  ARGV[6], ARGV[7])
return {R.OK, h[4] or '', 1}
