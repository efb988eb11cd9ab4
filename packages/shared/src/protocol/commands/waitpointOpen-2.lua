--[[
  A run opens a waitpoint (PROTOCOL.md §32.1), lock-checked. The first run that opens `field` stores `record` (its
  token, `state: "waiting"`, and `timeoutAt` = Redis' clock + timeoutMs); every later run gets the stored one back, so
  the URL is the same on every run of the task. A waiting one whose `timeoutAt` has passed is ended here (`timedOut`),
  atomically, so a callback after the timeout is refused.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] field             the waitpoint's field, `wp:<name>`
    ARGV[3] token             the token a new waitpoint gets
    ARGV[4] timeoutMs         how long a new waitpoint waits

  Output:
    {R.OK, record}            the waitpoint as stored: JSON {token, timeoutAt, state[, completedAt, value]}
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"
--- @include "redisNow"

local status = redis.call('HGET', KEYS[1], F.status)
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
local now = redis_now_ms()
local stored = redis.call('HGET', KEYS[1], ARGV[2])
if not stored then
  -- Built as text: cjson would print a 13-digit time in exponent form.
  stored = '{"token":' .. cjson.encode(ARGV[3]) .. ',"timeoutAt":' .. string.format('%d', now + tonumber(ARGV[4])) ..
    ',"state":"waiting"}'
  redis.call('HSET', KEYS[1], ARGV[2], stored)
  return {R.OK, stored}
end
local wp = cjson.decode(stored)
if wp.state == 'waiting' and now >= wp.timeoutAt then
  stored = '{"token":' .. cjson.encode(wp.token) .. ',"timeoutAt":' .. string.format('%d', wp.timeoutAt) ..
    ',"state":"timedOut"}'
  redis.call('HSET', KEYS[1], ARGV[2], stored)
end
return {R.OK, stored}
