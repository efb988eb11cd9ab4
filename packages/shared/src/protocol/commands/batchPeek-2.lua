--[[
  A batch's counters and whether its parent should run now (PROTOCOL.md §26.4, §26.5), in one read.

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] open              the open set

  Output:
    {R.OK, size, completed, failed, released, open, window, stopped, wake}   stopped, wake: "1" or "0"
    {R.TASK_MISSING}                                                        no such batch
]]
--- @include "resultCodes"
--- @include "batchFields"
--- @include "batchWake"

if redis.call('EXISTS', KEYS[1]) == 0 then return {R.TASK_MISSING} end
local s = batch_state(KEYS[1], KEYS[2])
local stopped, wake = '0', '0'
if s.stopped then stopped = '1' end
if s.wake then wake = '1' end
return {R.OK, s.size, s.completed, s.failed, s.released, s.open, s.window, stopped, wake}
