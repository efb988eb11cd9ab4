--[[
  A batch child's outcome (PROTOCOL.md §26.3), recorded exactly once: only by the run holding the child's job lock,
  and only the first time (HSETNX), so a child that ran twice (a stall, a crash after the tool returned) is counted
  once. The first record counts it, takes it out of the open and running sets and the principal's open work, and
  says whether this record should wake the parent (§26.4).

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] outcomes          the outcome hash
    KEYS[3] open              the open set (released, unrecorded)
    KEYS[4] running           the running set
    KEYS[5] lock              the child job's lock key
    KEYS[6] principalOpen     the principal's open-work set (the open-task cap, §25)

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] index             the child's index
    ARGV[3] childId           the child's job id (its member in principalOpen)
    ARGV[4] failed            "1" for a failure, "0" for a completion
    ARGV[5] outcome           the outcome, JSON

  Output:
    {R.OK, done, size, failed, wake, below}
                                          wake: "1" when this record should promote the parent (the crossing);
                                          below: "1" while the parent should run (§26.4's condition), crossed or not
    {R.OUTCOME_RECORDED}
    {R.TASK_MISSING}                      the batch is gone
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "batchFields"
--- @include "checkLock"
--- @include "batchWake"

if not holds_lock(KEYS[5], ARGV[1]) then return {R.LOCK_LOST} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {R.TASK_MISSING} end
local first = redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[5])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[6], ARGV[3])
if first == 0 then return {R.OUTCOME_RECORDED} end
local failure = ARGV[4] == '1'
if failure then redis.call('HINCRBY', KEYS[1], B.failed, 1)
else redis.call('HINCRBY', KEYS[1], B.completed, 1) end
local s = batch_state(KEYS[1], KEYS[3])
local wake, below = '0', '0'
if batch_crossed(s, failure) then wake = '1' end
if s.wake then below = '1' end
return {R.OK, s.done, s.size, s.failed, wake, below}
