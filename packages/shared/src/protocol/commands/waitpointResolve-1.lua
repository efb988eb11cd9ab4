--[[
  A waitpoint's URL was called (PROTOCOL.md §32.4): stores the body as its value, once. Only while the task exists,
  holds this very token under `field`, has not ended, and the waitpoint waits and is not past its `timeoutAt` (Redis'
  clock); a waitpoint called already answers so even once its task has ended. The value is stored as the caller's JSON text, never decoded and re-encoded here.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] field             the waitpoint's field, `wp:<name>`
    ARGV[2] token             the token the URL carried
    ARGV[3] value             the body, JSON text (checked by the caller)

  Output:
    {R.OK, queue}             stored: the task's job queue follows (the caller promotes the job)
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.WAITPOINT_UNKNOWN}     no such waitpoint with that token
    {R.WAITPOINT_USED}        called already
    {R.WAITPOINT_EXPIRED}     timed out
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "redisNow"

local h = redis.call('HMGET', KEYS[1], F.status, F.queue, ARGV[1])
if not h[1] then return {R.TASK_MISSING} end
if not h[3] then return {R.WAITPOINT_UNKNOWN} end
local wp = cjson.decode(h[3])
if wp.token ~= ARGV[2] then return {R.WAITPOINT_UNKNOWN} end
-- Called twice says so, whether or not the task has ended since.
if wp.state == 'completed' then return {R.WAITPOINT_USED} end
if is_terminal(h[1]) then return {R.TASK_TERMINAL} end
local now = redis_now_ms()
if wp.state ~= 'waiting' or now >= wp.timeoutAt then return {R.WAITPOINT_EXPIRED} end
redis.call('HSET', KEYS[1], ARGV[1], '{"token":' .. cjson.encode(wp.token) .. ',"timeoutAt":' ..
  string.format('%d', wp.timeoutAt) .. ',"state":"completed","completedAt":' .. string.format('%d', now) ..
  ',"value":' .. ARGV[3] .. '}')
return {R.OK, h[2] or ''}
