--[[
  The reaper (PROTOCOL.md §10.3): fails the due live tasks whose deadline passed or whose job is gone or failed, and
  schedules the others' next look. One process at a time holds the lease.

  Input:
    KEYS[1] live              the live set, scored by when the reaper next looks
    KEYS[2] lease             the reaper lease
    KEYS[3] webhookDue        the webhook outbox's due set (§27.2)
    KEYS[4] webhookPending    the outbox's pending counts per principal
    KEYS[5] webhookDead       the outbox's dead letters
    KEYS[6] retention         the deployment's retention policy (§30.1: status -> ms)

    ARGV[1] nowMs             now, ms since epoch
    ARGV[2] now               now, ISO
    ARGV[3] batch             how many due tasks one pass looks at
    ARGV[4] lookAgainMs       when a task still fine is looked at again
    ARGV[5] taskKeyPrefix     what a task key puts before the id
    ARGV[6] queueKeyPrefix    what a BullMQ queue key puts before the pool name
    ARGV[7] channelPrefix     gateway channel: what comes before the gateway id
    ARGV[8] channelSuffix     gateway channel: what comes after it
    ARGV[9] holder            who asks for the lease
    ARGV[10] leaseMs          how long the lease is held
    ARGV[11] webhookPrefix    what an outbox event key puts before the event id
    ARGV[12] publish          the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK, looked, {taskId, code, message, ...}}   the tasks failed by this pass
    {R.LEASE_HELD}                                 another process holds the lease
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "bullmqLayout"
--- @include "moveStatus"
--- @include "publishStatus"
--- @include "finish"
--- @include "outboxAppend"

if redis.call('SET', KEYS[2], ARGV[9], 'NX', 'PX', tonumber(ARGV[10])) == false then
  if redis.call('GET', KEYS[2]) ~= ARGV[9] then return {R.LEASE_HELD} end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[10]))
end
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local reaped = {}
for _, taskId in ipairs(due) do
  local taskKey = ARGV[5] .. taskId
  local h = redis.call('HMGET', taskKey, F.status, F.deadlineAt, F.queue, F.startedAt)
  if check_source(h[1], 'failed') ~= R.OK then
    -- Gone or ended: nothing to reap, and no reason to look again.
    redis.call('ZREM', KEYS[1], taskId)
  else
    local deadline = tonumber(h[2])
    local code, message
    if deadline and now >= deadline then
      code = 'TIMEOUT'
      if h[1] == 'input_required' then
        message = 'Task deadline passed: its input request was not answered in time'
      else
        message = 'Task deadline passed: no worker finished it in time'
      end
    else
      local queueKey = ARGV[6] .. (h[3] or '')
      local jobKey = bull_job_key(queueKey, taskId)
      if redis.call('EXISTS', jobKey) == 0 then
        code = 'JOB_LOST'
        message = 'The job of this task was lost (never enqueued, evicted or removed)'
      elseif redis.call('ZSCORE', bull_failed_key(queueKey), taskId) then
        code = 'JOB_LOST'
        local reason = redis.call('HGET', jobKey, BULL_FAILED_REASON)
        message = 'The job of this task failed: ' .. (reason or 'unknown reason')
      end
    end
    if code then
      local result = cjson.encode({content = {{type = 'text', text = message}}, isError = true})
      local err = cjson.encode({code = code, message = message})
      move_status(taskKey, h[1], 'failed', ARGV[2], {F.statusMessage, message, F.result, result, F.error, err})
      publish_status(taskKey, {type = 'status', taskId = taskId, status = 'failed', statusMessage = message,
        lastUpdatedAt = ARGV[2]}, ARGV[7], ARGV[8], ARGV[12])
      outbox_append(taskKey, 'failed', message, ARGV[2], KEYS[3], KEYS[4], KEYS[5], ARGV[11])
      finish(taskKey, KEYS[1], taskId, h[4] == false, 'failed', KEYS[6])
      reaped[#reaped + 1] = taskId
      reaped[#reaped + 1] = code
      reaped[#reaped + 1] = message
    else
      local again = now + tonumber(ARGV[4])
      if deadline and deadline < again then again = deadline end
      redis.call('ZADD', KEYS[1], again, taskId)
    end
  end
end
return {R.OK, #due, reaped}
