--[[
  A run stores one chunk of a value apart from its task's result (PROTOCOL.md §34.3, §34.4): a result or content block
  moved out, or an artifact. Lock-checked like every run write; refused once the task is terminal; bounded per task
  and per principal (checked before anything is written).

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key (the task key when the write is not a worker's)
    KEYS[3] blobs             the task's blob index hash
    KEYS[4] blob              the value's string
    KEYS[5] principalBytes    the principal's stored-bytes counter

    ARGV[1] lockToken         the worker's lock token; '' = no lock check
    ARGV[2] blobId            the value's id in the index
    ARGV[3] chunk             the bytes to store
    ARGV[4] append            '1': append to the value; '0': the first chunk (replaces)
    ARGV[5] meta              the value's description (JSON), written to the index; '' = leave it
    ARGV[6] taskMax           the most bytes a task may store
    ARGV[7] principalMax      the most bytes a principal may store within ttlMs
    ARGV[8] ttlMs             the expiry of the value, the index and the counter after this write
    ARGV[9] channel           the resources channel; '' = publish nothing
    ARGV[10] taskId           the task id, published on the channel
    ARGV[11] externalBytes    '' = the chunk is the value's bytes; else the value lives in an object store (S3) and
                              this many bytes are counted against the bounds, and no value key is written
    ARGV[12] publish          the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK, taskBytes}              stored; the task's total stored bytes
    {R.LIMIT_FULL, 'task'|'principal'}  a bound would be passed: nothing written
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"
--- @include "publishCommand"

local h = redis.call('HMGET', KEYS[1], F.status, F.sideKeys)
local status = h[1]
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
local external = ARGV[11] ~= ''
local size = external and tonumber(ARGV[11]) or #ARGV[3]
local taskBytes = tonumber(redis.call('HGET', KEYS[3], '\0bytes') or '0')
if taskBytes + size > tonumber(ARGV[6]) then return {R.LIMIT_FULL, 'task'} end
local principalBytes = tonumber(redis.call('GET', KEYS[5]) or '0')
if principalBytes + size > tonumber(ARGV[7]) then return {R.LIMIT_FULL, 'principal'} end
-- The task has keys that end with it now: its end looks at them (finish.lua), and only then (issue 46).
if not h[2] then redis.call('HSET', KEYS[1], F.sideKeys, '1') end
if external then
  -- nothing stored here: the index entry names the object
elseif ARGV[4] == '1' then
  redis.call('APPEND', KEYS[4], ARGV[3])
else
  redis.call('SET', KEYS[4], ARGV[3])
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[5]) end
taskBytes = redis.call('HINCRBY', KEYS[3], '\0bytes', size)
redis.call('INCRBY', KEYS[5], size)
for i = 3, 5 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[8]) end
end
if ARGV[9] ~= '' then redis.call(publish_command(ARGV[12]), ARGV[9], cjson.encode({taskId = ARGV[10]})) end
return {R.OK, taskBytes}
