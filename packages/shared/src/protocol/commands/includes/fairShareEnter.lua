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
