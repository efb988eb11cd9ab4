--[[
  A plain call's retried input round takes its route (PROTOCOL.md §17.3): the gateway serving the retry becomes the
  call's owner (its progress and status events go there), with the retry's progress token. The previous owner is
  kept as a watcher, so it still sees the call end and retires its own route.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] gatewayId         the gateway serving the retry
    ARGV[2] progressToken     the retry's progress token as JSON, or '' for none

  Output:
    {R.OK}
    {R.TASK_MISSING}          no such task, or it is not a plain call
    {R.TASK_TERMINAL, status}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"

local h = redis.call('HMGET', KEYS[1], F.mode, F.status, F.gatewayId, F.watchers)
if not h[1] or h[1] ~= 'call' then return {R.TASK_MISSING} end
if is_terminal(h[2]) then return {R.TASK_TERMINAL, h[2]} end
redis.call('HSET', KEYS[1], F.gatewayId, ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], F.progressToken, ARGV[2])
else
  redis.call('HDEL', KEYS[1], F.progressToken)
end
local old = h[3]
if old and old ~= '' and old ~= ARGV[1] then
  local watchers = h[4]
  local known = false
  if watchers then
    for id in string.gmatch(watchers, '[^,]+') do
      if id == old then known = true end
    end
  end
  if not known then
    redis.call('HSET', KEYS[1], F.watchers, (watchers and watchers ~= '') and (watchers .. ',' .. old) or old)
  end
end
return {R.OK}
