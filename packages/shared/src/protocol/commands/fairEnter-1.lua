--[[
  Enters a job in its principal's fair share of a pool (PROTOCOL.md §25) and answers the BullMQ priority to add it
  with (see fairShareEnter). One script, so two enqueues of one principal never read the same backlog. A task's
  creation does the same in its own script (create); this one is for jobs entered without a create.

  Input:
    KEYS[1] share             the principal's share of the pool (sorted set: job id by priority)

    ARGV[1] jobId             the job (= task) id
    ARGV[2] ttlMs             how long the share outlives its newest entry
    ARGV[3] maxPriority       the highest rank within a priority level
    ARGV[4] priorityBase      the job's priority level's base (§25.1)

  Output:
    {R.OK, priority}
]]
--- @include "resultCodes"
--- @include "fairShareEnter"

return {R.OK, fair_share_enter(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])}
