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
--- @include "readTask"

local fields, size = read_task(KEYS[1], ARGV[1])
return {R.OK, fields, size}
