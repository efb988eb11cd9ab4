--[[
  Keeps a run's log lines with its task (PROTOCOL.md §30.4): appended to the task's log stream, at most `maxLen`
  lines (the oldest dropped). Nothing is written for a task that is gone, so no stray stream outlives it; a task that
  has ended has its stream expire with its hash.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] logs              the task's log stream

    ARGV[1] maxLen            the most lines the stream keeps
    ARGV[2] lines             the lines: a JSON array of strings, each a JSON object as text

  Output:
    {R.OK}
    {R.TASK_MISSING}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"

local h = redis.call('HMGET', KEYS[1], F.status, F.sideKeys)
local status = h[1]
if not status then return {R.TASK_MISSING} end
-- The task has a key that ends with it now: its end looks at it (finish.lua), and only then (issue 46).
if not h[2] and not is_terminal(status) then redis.call('HSET', KEYS[1], F.sideKeys, '1') end
for _, line in ipairs(cjson.decode(ARGV[2])) do
  redis.call('XADD', KEYS[2], 'MAXLEN', tonumber(ARGV[1]), '*', 'line', line)
end
if is_terminal(status) then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then redis.call('PEXPIRE', KEYS[2], left) end
end
return {R.OK}
