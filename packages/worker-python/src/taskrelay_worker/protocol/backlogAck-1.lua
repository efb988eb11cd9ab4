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
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18, CHANNEL_FULL = -19}

local bytes
if ARGV[4] == '1' then
  bytes = 0
  redis.call('HSET', KEYS[1], 'bytes', 0)
else
  bytes = redis.call('HINCRBY', KEYS[1], 'bytes', -tonumber(ARGV[1]))
  if bytes < 0 then
    bytes = 0
    redis.call('HSET', KEYS[1], 'bytes', 0)
  end
end
redis.call('HSET', KEYS[1], 'max', ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return {R.OK, bytes}
