--[[
  Leases due webhook events to one gateway (PROTOCOL.md §27.3), fairly between principals: it walks the due events in
  order (at most `scan` of them) and takes each whose principal has fewer than `perPrincipal` tries in flight on this
  gateway (those it holds already, plus those taken here), until it has `batch`. So one principal's backlog of events
  to a dead receiver holds at most `perPrincipal` of a gateway's delivery slots, and another principal's events behind
  it are taken at the next poll. Each event taken counts a try, is leased to `holder` (token `<holder>:<try>`) and is
  hidden until the lease ends. Redis server time, as the append uses.

  Input:
    KEYS[1] due               the outbox's due set (score: when due, ms)

    ARGV[1] batch             events to take at most
    ARGV[2] leaseMs           how long a try holds its event
    ARGV[3] holder            the claiming gateway's id
    ARGV[4] eventPrefix       what an event key puts before the event id
    ARGV[5] perPrincipal      tries one principal may have in flight on this gateway
    ARGV[6] inFlight          JSON {principal: tries in flight on this gateway}
    ARGV[7] scan              due events looked at, at most

  Output:
    {R.OK, rows}              rows: one flat HGETALL list per event taken
]]
local R = {OK = 1, TASK_MISSING = -1, LOCK_LOST = -2, TRANSITION_REFUSED = -3, TASK_TERMINAL = -4, PROGRESS_STALE = -5, UNROUTED = -6, INPUT_NOT_PENDING = -7, TASK_EXISTS = -8, IDEMPOTENT_REPLAY = -9, LEASE_HELD = -10, OUTCOME_RECORDED = -11, BATCH_EXISTS = -12, OPEN_CAP = -13, VERSION_OTHER = -14, LIMIT_FULL = -15, WAITPOINT_UNKNOWN = -16, WAITPOINT_USED = -17, WAITPOINT_EXPIRED = -18}

local W = {id = 'id', taskId = 'taskId', principal = 'principal', url = 'url', status = 'status', statusMessage = 'statusMessage', timestamp = 'timestamp', attempts = 'attempts', lease = 'lease', createdAt = 'createdAt', lastError = 'lastError'}
local WEBHOOK_DEAD_LETTERS_KEPT = 1000

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[1])
local cap = tonumber(ARGV[5])
local held = cjson.decode(ARGV[6])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[7]))
local out = {}
for _, id in ipairs(due) do
  if #out >= batch then break end
  local key = ARGV[4] .. id
  local principal = redis.call('HGET', key, W.principal)
  if not principal then
    redis.call('ZREM', KEYS[1], id)
  elseif (tonumber(held[principal]) or 0) < cap then
    held[principal] = (tonumber(held[principal]) or 0) + 1
    local try = redis.call('HINCRBY', key, W.attempts, 1)
    redis.call('HSET', key, W.lease, ARGV[3] .. ':' .. try)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    out[#out + 1] = redis.call('HGETALL', key)
  end
end
return {R.OK, out}
