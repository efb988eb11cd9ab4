--[[
  Ends a task (PROTOCOL.md §10.1): the hash expires after its ttl, leaves the live set, drops its watchers, and its
  idempotency mapping is kept as long as the task (or freed at once, for a task that never ran); a dedupe mapping
  (§25.2) is freed at once: only an unfinished task is joined. A task (not a plain call) whose ending status has a
  retention in the deployment's policy (`retentionKey`, §30.1) is kept that long instead, and its ttl says so.
  `known`: the task's {ttl, idemKey, dedupe, mode, sideKeys, watchers} as the caller already read them (one HMGET per
  script, issue 46), or nil to read them here. Only what the task has is touched: its stored arguments in task mode,
  its output, stored values and kept log lines once a run wrote any (`sideKeys`), its watchers when it has some.
]]
--- @include "taskFields"

-- The retention policy's time for a task-mode task ending as `status` (§30.1), or '' when the policy has none. Read
-- by the transition before it publishes, so the terminal event can tell the ttl the task is kept for.
local function retained_ttl(retentionKey, mode, status)
  if mode ~= 'task' then return '' end
  return redis.call('HGET', retentionKey, status) or ''
end

local function finish(taskKey, liveKey, taskId, dropIdempotency, status, retentionKey, known, retained)
  local h = known or redis.call('HMGET', taskKey, F.ttl, F.idemKey, F.dedupe, F.mode, F.sideKeys, F.watchers)
  if h[3] == '1' then dropIdempotency = true end
  local ttl = tonumber(h[1]) or 60000
  if h[4] == 'task' then
    local kept = tonumber(retained or retained_ttl(retentionKey, h[4], status))
    if kept and kept ~= ttl then
      ttl = kept
      redis.call('HSET', taskKey, F.ttl, tostring(kept))
    end
  end
  redis.call('PEXPIRE', taskKey, ttl)
  -- Its stored arguments (§30.2, a task-mode task's) and its kept log lines (§30.4) go with it: `<P>:task-args:<id>`
  -- and `<P>:task-logs:<id>` beside its `<P>:task:<id>` (keys.ts).
  local base = string.sub(taskKey, 1, #taskKey - #taskId - #'task:')
  if h[4] == 'task' then redis.call('PEXPIRE', base .. 'task-args:' .. taskId, ttl) end
  if h[5] then
    redis.call('PEXPIRE', base .. 'task-logs:' .. taskId, ttl)
    -- Its output and stored values (§34) are readable only while the task is kept: they go with it when that comes
    -- first (`<P>:output:<id>`, `<P>:blobs:<id>` and each `<P>:blob:<id>:<blobId>` it lists), else at their own TTL.
    local function sooner(key)
      local left = redis.call('PTTL', key)
      if left == -1 or left > ttl then redis.call('PEXPIRE', key, ttl) end
    end
    local blobs = base .. 'blobs:' .. taskId
    for _, blobId in ipairs(redis.call('HKEYS', blobs)) do
      if blobId ~= '\0bytes' then sooner(base .. 'blob:' .. taskId .. ':' .. blobId) end
    end
    sooner(blobs)
    sooner(base .. 'output:' .. taskId)
  end
  redis.call('ZREM', liveKey, taskId)
  if h[6] then redis.call('HDEL', taskKey, F.watchers) end
  if h[2] and h[2] ~= '' then
    if dropIdempotency and redis.call('GET', h[2]) == taskId then
      redis.call('DEL', h[2])
    else
      redis.call('PEXPIRE', h[2], ttl)
    end
  end
end
