--[[
  A gateway's side of its channel backlog (PROTOCOL.md §22.4): takes off what it has read, sets its budget and keeps
  the hash alive. With `reset` (a new subscriber: whatever was published before it is never read) the count starts
  at 0. The count never goes below 0 (a read counted by a hash that expired meanwhile).

  Input:
    KEYS[1] backlog           the gateway's backlog hash {max, bytes}

    ARGV[1] read              bytes read since the last call
    ARGV[2] max               the gateway's budget, bytes
    ARGV[3] ttlMs             how long the hash outlives the gateway's last call
    ARGV[4] reset             '1': start the count at 0

  Output:
    {R.OK, bytes}             the count after the call
]]
--- @include "resultCodes"

local bytes
if ARGV[4] == '1' then
  bytes = 0
  redis.call('HSET', KEYS[1], 'bytes', 0)
elseif tonumber(ARGV[1]) > 0 then
  -- Only a positive read: `-0` reaches Redis as "-0", which HINCRBY refuses (a heartbeat with nothing read failed so,
  -- and its hash expired a minute after the gateway last read a message).
  bytes = redis.call('HINCRBY', KEYS[1], 'bytes', -tonumber(ARGV[1]))
  if bytes < 0 then
    bytes = 0
    redis.call('HSET', KEYS[1], 'bytes', 0)
  end
else
  bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes')) or 0
end
redis.call('HSET', KEYS[1], 'max', ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return {R.OK, bytes}
