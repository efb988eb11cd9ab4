--[[
  A batch child's run starts (PROTOCOL.md §26.3): it runs only while it holds its job's lock, its parent is live, the
  batch has not stopped, and its outcome is not recorded yet (a child that ran before, or a re-added job). A child
  allowed to run joins the batch's running set.

  Input:
    KEYS[1] task              the parent task hash
    KEYS[2] batch             the batch hash
    KEYS[3] outcomes          the outcome hash
    KEYS[4] running           the running set
    KEYS[5] lock              the child job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] index             the child's index

  Output:
    {R.OK, owner, parentPool}
    {R.TASK_MISSING}          parent (or batch) gone
    {R.TASK_TERMINAL}         parent ended, or the batch stopped
    {R.OUTCOME_RECORDED}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "batchFields"
--- @include "transitions"
--- @include "checkLock"

if not holds_lock(KEYS[5], ARGV[1]) then return {R.LOCK_LOST} end
local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL} end
local v = redis.call('HMGET', KEYS[2], B.owner, B.parentPool, B.stopped)
if not v[2] then return {R.TASK_MISSING} end
if v[3] == '1' then return {R.TASK_TERMINAL} end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then return {R.OUTCOME_RECORDED} end
redis.call('SADD', KEYS[4], ARGV[2])
return {R.OK, v[1] or '', v[2]}
