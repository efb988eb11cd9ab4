--[[
  Enters a job in its principal's fair share of a pool (PROTOCOL.md §25) and answers the BullMQ priority to add it
  with (see fairShareEnter). One script, so two enqueues of one principal never read the same backlog. A task's
  creation does the same in its own script (create); this one is for jobs entered without a create.

  Input:
    KEYS[1] share             the principal's share of the pool (sorted set: job id by priority)

    ARGV[1] jobId             the job (= task) id
    ARGV[2] ttlMs             how long the share outlives its newest entry
    ARGV[3] maxPriority       the highest rank within a priority level
    ARGV[4] priorityBase      the job's priority level's base (§25.1)

  Output:
    {R.OK, priority}
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

-- Enters a job in its principal's fair share of a queue (PROTOCOL.md §25) and answers its BullMQ priority: its
-- priority level's `base` (§25.1) plus its rank, one more than the principal's jobs still waiting there, never below
-- its newest waiting job's rank (its own jobs keep their order), at most `max_priority`. The share keeps ranks.
local function fair_share_enter(key, job_id, ttl_ms, max_priority, base)
  local waiting = redis.call('ZCARD', key)
  local priority = 1
  if waiting > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    priority = math.max(waiting + 1, tonumber(newest[2]) or 1)
    priority = math.min(priority, tonumber(max_priority))
  end
  redis.call('ZADD', key, priority, job_id)
  redis.call('PEXPIRE', key, ttl_ms)
  return priority + (tonumber(base) or 0)
end

return {R.OK, fair_share_enter(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])}
