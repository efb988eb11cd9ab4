--[[
  A run suspends (PROTOCOL.md §12): lock-checked. With input requests (one or several asked at once) it stores each
  one not yet answered, adds it to the pending list, moves the task to input_required through the transition table
  (a status event carrying inputRequestId, the newly pending numbers) and sets the input deadline. Requests already
  answered are returned instead. A timed suspension only moves the deadline, and sets the status message when one is
  given (a back-off, §3.4, or a hand-back, §5.7: the task stays working and says why and until when), publishing it
  as a status event so that listeners see it at once.

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
    ARGV[9] publish           the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK, answers}                    answers: flat {n, answerJSON, ...} of the requests already answered
    {R.TASK_MISSING}
    {R.TASK_TERMINAL, status}
    {R.TRANSITION_REFUSED, status}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "checkLock"
--- @include "moveStatus"
--- @include "publishStatus"
--- @include "outboxAppend"

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL, status} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
if ARGV[2] == '' then
  redis.call('HSET', KEYS[1], F.deadlineAt, ARGV[4])
  if ARGV[8] ~= '' then
    redis.call('HSET', KEYS[1], F.statusMessage, ARGV[8], F.lastUpdatedAt, ARGV[3], F.backOff, '1')
    -- Said at once to whoever follows the task (a listen stream, the caller's stream: §18), not with its next change.
    -- Only while working: an input_required event without its request would withdraw the question (§12.9).
    if status == 'working' then
      local taskId = redis.call('HGET', KEYS[1], F.taskId)
      publish_status(KEYS[1], {type = 'status', taskId = taskId, status = status, lastUpdatedAt = ARGV[3],
        statusMessage = ARGV[8]}, ARGV[5], ARGV[6], ARGV[9])
    end
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
  publish_status(KEYS[1], event, ARGV[5], ARGV[6], ARGV[9])
  -- Another question while the task already waits is no status change: no second webhook event.
  if status ~= 'input_required' then
    outbox_append(KEYS[1], 'input_required', message, ARGV[3], KEYS[3], KEYS[4], KEYS[5], ARGV[7])
  end
end
return {R.OK, answers}
