--[[
  A worker's write is lock-checked (PROTOCOL.md §10.4): true when the job's lock holds `token`, or when the write is
  not a worker's (an empty token).
]]

local function holds_lock(lockKey, token)
  return token == '' or redis.call('GET', lockKey) == token
end
