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
    ARGV[3] fieldCount        how many ARGV entries the extra fields take (ARGV[13] on)
    ARGV[4] lockToken         the worker's lock token; '' = no lock check
    ARGV[5] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[6] channelSuffix     gateway channel: what comes after it
    ARGV[7] ackTo             gateway to name in the event's ackTo, or ''
    ARGV[8] deadlineAt        the new deadline (ms since epoch), or '' to keep it
    ARGV[9] dropIdempotency   '1' to free the idempotency key at once (the task never ran)
    ARGV[10] eventOutcome     '1' to carry result and error in the terminal event (finalJson = true; §6.7)
    ARGV[11] webhookPrefix    what an outbox event key puts before the event id
    ARGV[12] publish          the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)
    ARGV[13] fields           the first extra field's name (statusMessage, result, error, cancelReason); the extra
                              fields' names and values follow, fieldCount entries in all. Flat, not one JSON
                              object: decoding JSON that holds a result cost Redis time in proportion to the result's
                              size, on every end (issue 46)

  Output:
    {R.OK, to}
    {R.TASK_MISSING}
    {R.LOCK_LOST, current}             another run holds the job
    {R.TASK_TERMINAL, current}         the task has ended already
    {R.TRANSITION_REFUSED, current}    the table does not allow the move
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "checkLock"
--- @include "moveStatus"
--- @include "publishStatus"
--- @include "finish"
--- @include "outboxAppend"

-- One read of every field of the task this script looks at, its includes' too (a Redis command per call counts,
-- issue 46): what move_status, publish_status, outbox_append and finish would each read again.
local h = redis.call('HMGET', KEYS[1], F.status, F.taskId, F.statusMessage, F.gatewayId, F.watchers, F.webhook,
  F.principal, F.webhookCap, F.ttl, F.idemKey, F.dedupe, F.mode, F.sideKeys)
local current = h[1]
if not current then return {R.TASK_MISSING} end
if not holds_lock(KEYS[3], ARGV[4]) then return {R.LOCK_LOST, current} end
local extra = {}
local fields = {}
for i = 13, 12 + tonumber(ARGV[3]), 2 do
  extra[ARGV[i]] = ARGV[i + 1]
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
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
-- An ending the retention policy keeps for another time than the task's ttl says so in its event (§6.7, §30.1): the
-- gateway that holds the ended task answers tasks/get from it.
local terminal = is_terminal(ARGV[1])
local retained
if terminal then
  retained = retained_ttl(KEYS[7], h[12], ARGV[1])
  local kept = tonumber(retained)
  if kept and kept ~= tonumber(h[9]) then event.ttl = kept end
end
-- The outcome rides on a terminal event as JSON values (`resultJson`, `errorJson`), the stored text written in
-- place: as strings (`result`, `error`, what older scripts send), cjson escaped every quote of it again, on every end.
-- Marked `finalJson`, not `final`: a gateway of an earlier version, which knows only `final` with strings, reads the
-- hash instead, as for an outcome too big to publish.
local raw = ''
if ARGV[10] == '1' then
  event.finalJson = true
  if extra.result and extra.result ~= '' then raw = ',"resultJson":' .. extra.result end
  if extra.error and extra.error ~= '' then raw = raw .. ',"errorJson":' .. extra.error end
end
-- The write above sets only the status, its time, the deadline and the extra fields (statusMessage, result, error,
-- cancelReason): none of the fields read here, so the read stands for what the includes would read now.
publish_status(KEYS[1], event, ARGV[5], ARGV[6], ARGV[12], {h[4], h[5]}, raw)
if terminal or (ARGV[1] == 'input_required' and current ~= 'input_required') then
  outbox_append(KEYS[1], ARGV[1], message, ARGV[2], KEYS[4], KEYS[5], KEYS[6], ARGV[11], {h[6], h[7], h[2], h[8]})
end
if terminal then
  finish(KEYS[1], KEYS[2], taskId, ARGV[9] == '1', ARGV[1], KEYS[7], {h[9], h[10], h[11], h[12], h[13], h[5]},
    retained)
end
return {R.OK, ARGV[1]}
