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
    {R.OK}                    the start is recorded
    {R.LIMIT_FULL, waitMs}    not now: wait this long (the hold's rest, or until the oldest start leaves the window)
]]
--- @include "resultCodes"
--- @include "redisNow"

local now = redis_now_ms()
local held = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if held > now then return {R.LIMIT_FULL, held - now} end
local perMs = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - perMs)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], perMs)
  return {R.OK}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {R.LIMIT_FULL, math.max(1, tonumber(oldest[2]) + perMs - now)}
