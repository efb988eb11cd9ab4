--[[
  A back-off holds a rate limit (PROTOCOL.md §3.4, §3.5): no start until now + ms, for every tool that shares it. A
  longer hold already there is kept.

  Input:
    KEYS[1] hold              held until (ms)

    ARGV[1] ms                hold this long from now

  Output:
    {R.OK, until}
]]
--- @include "resultCodes"
--- @include "redisNow"

local ms = tonumber(ARGV[1])
local untilMs = redis_now_ms() + ms
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if held >= untilMs then return {R.OK, held} end
redis.call('SET', KEYS[1], untilMs, 'PX', ms)
return {R.OK, untilMs}
