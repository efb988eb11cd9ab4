--[[
  A parent releases its batch's next children, or re-adds open ones (PROTOCOL.md §26.3 step 2, §26.6), and learns
  each child's BullMQ priority from the fair-share rule every job of the pool gets (`fairShareEnter`, §25): a batch's
  children are one more backlog of their principal's, entered one by one as the gateway enters tasks.

  A release sizes the window in the same script that opens the children, so two batches of one principal released at
  once both see the other's children: window = the concurrency, less what the principal's open-work cap leaves beside
  its other open work (every member of principalOpen that is not this batch's open child), at least 1. It releases
  `released .. released + window − open − 1` (at most the batch's size): each joins the open set and the principal's
  open work before its job exists, and `released` moves past them in this same script, so no index is ever released
  twice (a parent that dies before it adds their jobs leaves them open without a job: its next run re-adds them). A
  re-add takes the open indices it is given.

  Then each child's priority: 0 when its job is in the pool already (queued, running, delayed for a retry or failed:
  the add would be a no-op, and an entry for it would never leave the share), the priority its share entry has when
  it has one (an add that failed after the entry was made), else a new entry's (`fair_share_enter`). The caller adds
  the jobs of the children with a priority above 0, after this reply.

  Input:
    KEYS[1] batch             the batch hash
    KEYS[2] open              the batch's open set
    KEYS[3] share             the principal's fair share of the child pool
    KEYS[4] principalOpen     the principal's open work (sorted set: id by time)

    ARGV[1] parentId          the parent task id (a child's job id is `<parentId>.<index>`)
    ARGV[2] indices           a re-add: the open children's indices, joined by ","; a release: ""
    ARGV[3] release           "1": release the next children; "0": re-add `indices`
    ARGV[4] concurrency       the batch's concurrency
    ARGV[5] cap               the principal's open-work cap
    ARGV[6] nowMs             the time the children's open-work entries get
    ARGV[7] openWorkTtlMs     the principal's open work lives at least this long after a release
    ARGV[8] shareTtlMs        how long the share outlives its newest entry
    ARGV[9] maxPriority       BullMQ's highest priority value
    ARGV[10] queueKey         the child pool's BullMQ queue key (a job's hash is bull_job_key(queueKey, jobId))
    ARGV[11] priorityBase     the parent's priority level's base: children take their parent's level (§25.1)
    ARGV[12] enter            "0": answer 1 for every child and touch neither the share nor the jobs (the sharded
                              layout, §26.10: the children queue on other shards, where a re-add of this script
                              enters them); anything else: as above

  Output:
    {R.OK, window, from, priority, ...}   a priority per child, for indices from, from + 1, ... (a release), or for
                                          `indices` in order (a re-add: window and from are 0); 0: do not add it
]]
--- @include "resultCodes"
--- @include "batchFields"
--- @include "bullmqLayout"
--- @include "fairShareEnter"

local release = ARGV[3] == '1'
local indices = {}
local window, from = 0, 0
if release then
  local v = redis.call('HMGET', KEYS[1], B.size, B.released)
  local size, released = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  local open = redis.call('SCARD', KEYS[2])
  local others = redis.call('ZCARD', KEYS[4]) - open
  window = math.max(1, math.min(tonumber(ARGV[4]), tonumber(ARGV[5]) - others))
  from = released
  local count = math.max(0, math.min(window - open, size - released))
  for i = 0, count - 1 do indices[#indices + 1] = tostring(from + i) end
  redis.call('HSET', KEYS[1], B.window, window, B.released, from + count)
else
  for index in string.gmatch(ARGV[2], '[^,]+') do indices[#indices + 1] = index end
end

local reply = {R.OK, window, from}
for _, index in ipairs(indices) do
  local id = ARGV[1] .. '.' .. index
  if release then
    redis.call('SADD', KEYS[2], index)
    redis.call('ZADD', KEYS[4], ARGV[6], id)
  end
  local priority = 0
  if ARGV[12] == '0' then priority = 1
  elseif redis.call('EXISTS', bull_job_key(ARGV[10], id)) == 0 then
    local entered = redis.call('ZSCORE', KEYS[3], id)
    if entered then priority = tonumber(entered) + (tonumber(ARGV[11]) or 0)
    else priority = fair_share_enter(KEYS[3], id, ARGV[8], ARGV[9], ARGV[11]) end
  end
  reply[#reply + 1] = priority
end
-- Never shortens it (a gateway's ttl for the principal's open tasks may be longer); -1 (none) is below any.
if release and #indices > 0 and redis.call('PTTL', KEYS[4]) < tonumber(ARGV[7]) then
  redis.call('PEXPIRE', KEYS[4], ARGV[7])
end
return reply
