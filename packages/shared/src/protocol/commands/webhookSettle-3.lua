--[[
  Records what one webhook try came to (PROTOCOL.md §27.5), only while the try still holds its event's lease: a retry
  is due again after its delay; a delivered, gone or dead event leaves the outbox (a dead one joins the dead letters,
  at most WEBHOOK_DEAD_LETTERS_KEPT kept) and its principal's pending count goes down. Redis server time.

  Input:
    KEYS[1] due               the outbox's due set
    KEYS[2] pending           pending events per principal
    KEYS[3] dead              the dead letters (newest first)

    ARGV[1] eventPrefix       what an event key puts before the event id
    ARGV[2] id                the event
    ARGV[3] lease             the try's lease token
    ARGV[4] outcome           delivered | gone | retry | dead
    ARGV[5] delayMs           retry: when it is due again
    ARGV[6] reason            retry and dead: why

  Output:
    {R.OK}
    {R.LEASE_HELD}            the lease ran out: another try holds the event now
]]
--- @include "resultCodes"
--- @include "deadLetter"

local key = ARGV[1] .. ARGV[2]
if redis.call('HGET', key, W.lease) ~= ARGV[3] then return {R.LEASE_HELD} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] == 'retry' then
  redis.call('HSET', key, W.lease, '', W.lastError, ARGV[6])
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[2])
  return {R.OK}
end
local h = redis.call('HMGET', key, W.principal, W.taskId, W.url, W.status, W.attempts, W.timestamp, W.statusMessage)
if ARGV[4] == 'dead' then
  -- The event's time and message ride along, so an operator's resend (§27.6) sends what the first tries sent.
  dead_letter(KEYS[3], {id = ARGV[2], taskId = h[2], principal = h[1], url = h[3], status = h[4],
    attempts = tonumber(h[5]), reason = ARGV[6], deadAt = now, timestamp = h[6] or nil, statusMessage = h[7] or nil})
end
redis.call('DEL', key)
redis.call('ZREM', KEYS[1], ARGV[2])
local principal = h[1] or ''
if redis.call('HINCRBY', KEYS[2], principal, -1) <= 0 then redis.call('HDEL', KEYS[2], principal) end
return {R.OK}
