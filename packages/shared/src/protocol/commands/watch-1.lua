--[[
  Reads a task and, while it is not terminal, registers a gateway to be told of its status changes: a waiter on
  another gateway than the owner (PROTOCOL.md §10.9).

  Input:
    KEYS[1] task              the task hash

    ARGV[1] gatewayId         the waiting gateway
    ARGV[2] inlineMax         largest result (bytes) read with the rest; a larger one is left out (§22.5)

  Output:
    {R.OK, hash, resultBytes}   the hash as a flat list, without a result over inlineMax
    {R.TASK_MISSING}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "readTask"

local h, size = read_task(KEYS[1], ARGV[2])
if #h == 0 then return {R.TASK_MISSING} end
local status, owner, watchers
for i = 1, #h, 2 do
  if h[i] == F.status then status = h[i + 1] elseif h[i] == F.gatewayId then owner = h[i + 1]
  elseif h[i] == F.watchers then watchers = h[i + 1] end
end
if is_terminal(status) or owner == ARGV[1] then return {R.OK, h, size} end
if watchers then
  for id in string.gmatch(watchers, '[^,]+') do
    if id == ARGV[1] then return {R.OK, h, size} end
  end
  redis.call('HSET', KEYS[1], F.watchers, watchers .. ',' .. ARGV[1])
else
  redis.call('HSET', KEYS[1], F.watchers, ARGV[1])
end
return {R.OK, h, size}
