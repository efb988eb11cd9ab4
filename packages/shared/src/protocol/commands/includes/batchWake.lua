--[[
  A batch's counters, and whether its parent should run now (PROTOCOL.md §26.4): every child is recorded, fail-fast
  tripped, or at most half a window is still in flight while children remain to release. `batch_state` answers the
  condition as it stands (the parent's own check after it suspends); the child that records an outcome promotes the
  parent only when its record makes the condition true (`batch_crossed`), so one window wakes the parent once.
]]

local function batch_state(batchKey, openKey)
  local v = redis.call('HMGET', batchKey, B.size, B.completed, B.failed, B.released, B.window, B.failFast, B.stopped)
  local s = {
    size = tonumber(v[1]) or 0,
    completed = tonumber(v[2]) or 0,
    failed = tonumber(v[3]) or 0,
    released = tonumber(v[4]) or 0,
    window = tonumber(v[5]) or 1,
    failFast = v[6] == '1',
    stopped = v[7] == '1',
    open = redis.call('SCARD', openKey),
  }
  s.done = s.completed + s.failed
  local wake = false
  if s.done >= s.size then wake = true
  elseif s.failFast and s.failed > 0 then wake = true
  elseif s.released < s.size and s.open <= math.floor(s.window / 2) then wake = true end
  s.wake = wake and not s.stopped
  return s
end

local function batch_crossed(s, recordedFailure)
  if s.stopped then return false end
  if s.done >= s.size then return true end
  if s.failFast and recordedFailure and s.failed == 1 then return true end
  return s.released < s.size and s.open == math.floor(s.window / 2)
end
