--[[
  Redis' own clock in ms: the one clock every worker of a limit agrees on (PROTOCOL.md §3.5), whatever its host's.
]]

local function redis_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
