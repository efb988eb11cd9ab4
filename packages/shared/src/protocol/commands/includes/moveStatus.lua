--[[
  The one status write (PROTOCOL.md §2): checks the move against the transition table, generated from
  allowedSources(), and writes the status with its time and any extra fields. Every script that changes a status goes
  through here; none writes the status field itself.

  Returns R.OK when written; R.TASK_MISSING when there is no task (current is false or nil); R.TASK_TERMINAL when the
  task has ended; R.TRANSITION_REFUSED when the table does not allow `to` after `current`.
]]
--- @include "transitions"
--- @include "resultCodes"
--- @include "taskFields"

local function check_source(current, to)
  if not current then return R.TASK_MISSING end
  if allowed_source(to, current) then return R.OK end
  if is_terminal(current) then return R.TASK_TERMINAL end
  return R.TRANSITION_REFUSED
end

-- extra: a flat list {field, value, ...} written with the status.
local function move_status(taskKey, current, to, now, extra)
  local code = check_source(current, to)
  if code ~= R.OK then return code end
  local args = {F.status, to, F.lastUpdatedAt, now}
  for i = 1, #extra do args[#args + 1] = extra[i] end
  redis.call('HSET', taskKey, unpack(args))
  return R.OK
end
