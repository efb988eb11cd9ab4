-- Reads a task hash (PROTOCOL.md §22.5): the whole of it when its result is at most `inline_max` bytes, else every
-- field but the result (the big value never leaves Redis in the reply). Returns the flat list and the result's size.
--- @include "taskFields"

local function read_task(key, inline_max)
  local size = redis.call('HSTRLEN', key, F.result)
  if size <= tonumber(inline_max) then return redis.call('HGETALL', key), size end
  local wanted = {}
  for _, name in ipairs(redis.call('HKEYS', key)) do
    if name ~= F.result then wanted[#wanted + 1] = name end
  end
  local flat = {}
  if #wanted > 0 then
    local values = redis.call('HMGET', key, unpack(wanted))
    for i, name in ipairs(wanted) do
      flat[#flat + 1] = name
      flat[#flat + 1] = values[i]
    end
  end
  return flat, size
end
