--[[
  A run gives its slot of a per-key concurrency limit back (PROTOCOL.md §3.5), and learns which waiting jobs now have
  room: the oldest waiters, as many as there are free slots. The caller promotes their jobs; each takes again.

  Input:
    KEYS[1] slots             the limit's holders (sorted set: holder id -> lease end, ms)
    KEYS[2] waiting           its waiting jobs (sorted set: "<queue> <jobId>" -> its place in line, slotTake)
    KEYS[3] waitingBy         the principal of each waiter of a shared limit (hash)

    ARGV[1] holder            the holder id (the run's job id)
    ARGV[2] limit             at most this many holders
    ARGV[3] waiter            the releasing run's own "<queue> <jobId>" (no longer waiting, if it was)

  Output:
    {R.OK, waiter, ...}       the waiters to promote, first in line first
]]
--- @include "resultCodes"
--- @include "redisNow"

local now = redis_now_ms()
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local room = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local reply = {R.OK}
if room > 0 then
  for _, waiter in ipairs(redis.call('ZRANGE', KEYS[2], 0, room - 1)) do reply[#reply + 1] = waiter end
end
return reply
