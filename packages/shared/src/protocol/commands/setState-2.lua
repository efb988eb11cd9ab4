--[[
  A run writes its durable state (PROTOCOL.md §12.1): lock-checked, refused once the task is terminal.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] field             F.state or F.steps
    ARGV[3] json              the value, JSON

  Output:
    {R.OK}
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
if ARGV[2] ~= F.state and ARGV[2] ~= F.steps then return redis.error_reply('setState writes state or steps only') end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return {R.OK}
