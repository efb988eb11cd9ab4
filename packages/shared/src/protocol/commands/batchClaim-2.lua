--[[
  The first of a batch child's two record steps in the sharded layout (PROTOCOL.md §26.10): on the child's own shard,
  under its job lock, the child's one outcome is claimed (SET NX), so a run that lost its lock writes nothing and the
  outcome counted on the parent's shard (`batchRecord`, the second step) is the same whoever does that step. A claim
  that exists already is kept, and answered.

  Input:
    KEYS[1] lock              the child job's lock key
    KEYS[2] claim             the child's claimed outcome (string)

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] outcome           the outcome, JSON
    ARGV[3] ttlMs             how long the claim lives (the batch's keys' ttl)

  Output:
    {R.OK, outcome}           the claimed outcome (this one, or the one claimed before)
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "checkLock"

if not holds_lock(KEYS[1], ARGV[1]) then return {R.LOCK_LOST} end
redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3])
return {R.OK, redis.call('GET', KEYS[2])}
