--[[
  A run adds tags to its task (PROTOCOL.md §30.2: `ctx.tag`): merged with the task's, each once, lock-checked,
  refused once the task is terminal or when the task would carry more than `max`. The tags are checked by the caller.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] tags              the tags to add, as a comma list
    ARGV[3] max               the most tags a task carries

  Output:
    {R.OK, tags}              the task's tags now, as a comma list
    {R.LIMIT_FULL, tags}      more than `max` together: nothing written (the task's tags follow)
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"

local h = redis.call('HMGET', KEYS[1], F.status, F.tags)
if not h[1] then return {R.TASK_MISSING} end
if is_terminal(h[1]) then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
local list, seen = {}, {}
for tag in string.gmatch((h[2] or '') .. ',' .. ARGV[2], '[^,]+') do
  if not seen[tag] then
    seen[tag] = true
    list[#list + 1] = tag
  end
end
local joined = table.concat(list, ',')
if #list > tonumber(ARGV[3]) then return {R.LIMIT_FULL, h[2] or ''} end
redis.call('HSET', KEYS[1], F.tags, joined)
return {R.OK, joined}
