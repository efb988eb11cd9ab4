--[[
  Ends a task (PROTOCOL.md §10.1): the hash expires after its ttl, leaves the live set, drops its watchers, and its
  idempotency mapping is kept as long as the task (or freed at once, for a task that never ran); a dedupe mapping
  (§25.2) is freed at once: only an unfinished task is joined.
]]
--- @include "taskFields"

local function finish(taskKey, liveKey, taskId, dropIdempotency)
  local h = redis.call('HMGET', taskKey, F.ttl, F.idemKey, F.dedupe)
  if h[3] == '1' then dropIdempotency = true end
  local ttl = tonumber(h[1]) or 60000
  redis.call('PEXPIRE', taskKey, ttl)
  redis.call('ZREM', liveKey, taskId)
  redis.call('HDEL', taskKey, F.watchers)
  if h[2] and h[2] ~= '' then
    if dropIdempotency and redis.call('GET', h[2]) == taskId then
      redis.call('DEL', h[2])
    else
      redis.call('PEXPIRE', h[2], ttl)
    end
  end
end
