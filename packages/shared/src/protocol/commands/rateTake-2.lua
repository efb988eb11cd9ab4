--[[
  A run takes a start of a per-key or shared rate limit (PROTOCOL.md §3.5): at most `max` starts in any window of
  `perMs`, exactly (a log of the starts, not fixed windows), unless the limit is held by a back-off (§3.4).

  Input:
    KEYS[1] starts            the limit's starts (sorted set: start id -> when, ms)
    KEYS[2] hold              held until (ms), set by `rateHold`

    ARGV[1] start             this start's id (unique per run)
    ARGV[2] max               at most this many starts ...
    ARGV[3] perMs             ... in any window of this many ms

  Output:
    {R.OK, roomInMs}          the start is recorded; roomInMs: 0 while the window has room for another start, else
                              the time until its oldest start leaves it (a paced limit holds BullMQ's takes that
                              long, §3.3)
    {R.LIMIT_FULL, waitMs}    not now: wait this long (the hold's rest, or until the oldest start leaves the window)
]]
--- @include "resultCodes"
--- @include "redisNow"

local now = redis_now_ms()
local held = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if held > now then return {R.LIMIT_FULL, held - now} end
local perMs = tonumber(ARGV[3])
local max = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - perMs)
local count = redis.call('ZCARD', KEYS[1])
-- The time until the oldest start leaves the window (a start at t counts until t + perMs).
local function untilRoom()
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + perMs - now)
end
if count < max then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], perMs)
  if count + 1 < max then return {R.OK, 0} end
  return {R.OK, untilRoom()}
end
return {R.LIMIT_FULL, untilRoom()}
