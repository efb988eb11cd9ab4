--[[
  A plain call becomes a task (PROTOCOL.md §17.4): an `inputFirst` tool's call, whose input rounds are answered,
  turns into a task of its principal. Only a call that is not terminal moves; its ttl becomes the task's, and it
  joins the principal's index and the operators' task index (§30.2) so it is listed from then on. Its arguments are not
  kept (a replay of it answers that it has none, §30.3).

  Input:
    KEYS[1] task              the task hash
    KEYS[2] principalIndex    the principal's task-mode index (sorted set)
    KEYS[3] taskIndex         every task-mode task, scored by creation time

    ARGV[1] ttl               the ttl granted to the task, ms
    ARGV[2] indexCap          how many ids the index keeps
    ARGV[3] indexTtlMs        the index expires this long after its last addition
    ARGV[4] taskId            the task's id
    ARGV[5] createdAtMs       the task's creation time, ms since epoch (the index score)

  Output:
    {R.OK}
    {R.TASK_MISSING}          no such task, or it is not a plain call
    {R.TASK_TERMINAL, status}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"

local h = redis.call('HMGET', KEYS[1], F.mode, F.status)
if not h[1] or h[1] ~= 'call' then return {R.TASK_MISSING} end
if is_terminal(h[2]) then return {R.TASK_TERMINAL, h[2]} end
redis.call('HSET', KEYS[1], F.mode, 'task', F.ttl, ARGV[1])
redis.call('ZADD', KEYS[2], tonumber(ARGV[5]), ARGV[4])
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[4])
local cap = tonumber(ARGV[2])
if redis.call('ZCARD', KEYS[2]) > cap then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(cap + 1)) end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
return {R.OK}
