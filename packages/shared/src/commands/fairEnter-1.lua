--[[
  Enters a job in its principal's fair share of a pool (PROTOCOL.md §25) and answers the BullMQ priority to add it
  with: one more than the principal's jobs still waiting there, never below its newest waiting job's priority (its own
  jobs keep their order), at most BullMQ's highest priority value. One script, so two enqueues of one principal never
  read the same backlog.

  Input:
    KEYS[1] share             the principal's share of the pool (sorted set: job id by priority)

    ARGV[1] jobId             the job (= task) id
    ARGV[2] ttlMs             how long the share outlives its newest entry
    ARGV[3] maxPriority       BullMQ's highest priority value

  Output:
    {R.OK, priority}
]]
--- @include "resultCodes"

local waiting = redis.call('ZCARD', KEYS[1])
local priority = 1
if waiting > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  priority = math.max(waiting + 1, tonumber(newest[2]) or 1)
  priority = math.min(priority, tonumber(ARGV[3]))
end
redis.call('ZADD', KEYS[1], priority, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {R.OK, priority}
