--[[
  A parent's first `ctx.fanOut` stores its batch (PROTOCOL.md §26.2): the batch hash and the item list, once. A replay
  of the parent finds the batch there and writes nothing. Lock-checked: only the run holding the parent's job.

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] items             the item list
    KEYS[3] lock              the parent job's lock key
    KEYS[4] task              the parent task hash

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] fields            JSON object: batch field -> value
    ARGV[3] items             the items' JSON texts, joined by "\n" (JSON text never holds a raw newline)
    ARGV[4] ttlMs             how long the batch keys live (renewed when the batch ends)

  Output:
    {R.OK}
    {R.BATCH_EXISTS}
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"

local status = redis.call('HGET', KEYS[4], F.status)
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[3], ARGV[1]) then return {R.LOCK_LOST} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {R.BATCH_EXISTS} end

local fields = cjson.decode(ARGV[2])
for name, value in pairs(fields) do
  redis.call('HSET', KEYS[1], name, tostring(value))
end
local chunk = {}
for item in string.gmatch(ARGV[3], '[^\n]+') do
  chunk[#chunk + 1] = item
  if #chunk == 1000 then
    redis.call('RPUSH', KEYS[2], unpack(chunk))
    chunk = {}
  end
end
if #chunk > 0 then redis.call('RPUSH', KEYS[2], unpack(chunk)) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {R.OK}
