--[[
  Reads a task (PROTOCOL.md §22.5): the whole hash when its result is small, else every field but the result, and the
  result's size. A large result then comes over a connection of its own (`RedisTaskStore` large reads), so it never
  holds the connection every other command of the gateway waits on.

  Input:
    KEYS[1] task              the task hash

    ARGV[1] inlineMax         largest result (bytes) read with the rest

  Output:
    {R.OK, fields, resultBytes}   fields: flat name, value, ...; empty when the task is missing
]]
--- @include "resultCodes"
--- @include "taskFields"

local size = redis.call('HSTRLEN', KEYS[1], F.result)
if size <= tonumber(ARGV[1]) then return {R.OK, redis.call('HGETALL', KEYS[1]), size} end
local wanted = {}
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if name ~= F.result then wanted[#wanted + 1] = name end
end
local fields = {}
if #wanted > 0 then
  local values = redis.call('HMGET', KEYS[1], unpack(wanted))
  for i, name in ipairs(wanted) do
    fields[#fields + 1] = name
    fields[#fields + 1] = values[i]
  end
end
return {R.OK, fields, size}
