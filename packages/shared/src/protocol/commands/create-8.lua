--[[
  Stores a new task (PROTOCOL.md §10.1, §10.8, §25, §30.2): the hash, its place in the live set, in the principal's
  open-work set (the cap) and, in task mode, in the principal's index and the operators' task index, with its
  arguments; or, when the idempotency key already names a live task, or the principal is at its open-work cap,
  nothing.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] principalIndex    the principal's task-mode index (sorted set)
    KEYS[3] live              the live set
    KEYS[4] idempotency       the idempotency or dedupe key (the task key when there is none)
    KEYS[5] share             the principal's fair share of the task's pool (the task key when not entered)
    KEYS[6] openTasks         the principal's open-work set (the task key when there is no cap)
    KEYS[7] taskIndex         every task-mode task, scored by creation time (§30.2)
    KEYS[8] arguments         the task's stored arguments (string; kept with the hash, §30.2)

    ARGV[1] fieldCount        how many ARGV entries the hash fields take (ARGV[18] on: name, value, name, value...)
    ARGV[2] createdAtMs       creation time, ms since epoch (the index score)
    ARGV[3] taskId            the new task's id
    ARGV[4] firstLookAtMs     when the reaper first looks at the task
    ARGV[5] indexed           '1' to add the task to the principal's index
    ARGV[6] indexCap          how many ids the index keeps
    ARGV[7] indexTtlMs        the index expires this long after its last addition
    ARGV[8] hasIdempotency    '1' when KEYS[4] is an idempotency key; '2' when it is a dedupe key (§25.2: it joins
                              only an unfinished task, and expires after dedupeTtlMs)
    ARGV[9] taskKeyPrefix     what a task key puts before the id (an idempotent replay's task; a replayed original)
    ARGV[10] shareTtlMs       '' = no fair-share entry; else how long the share outlives this entry (§25)
    ARGV[11] maxPriority      BullMQ's highest priority value
    ARGV[12] openMax          '' = no open-work cap; else how many members KEYS[6] may hold
    ARGV[13] openTtlMs        how long the open-work set outlives its newest member
    ARGV[14] priorityBase     the BullMQ priority of the job's priority level's first rank, less one (§25.1)
    ARGV[15] dedupeTtlMs      how long a dedupe key joins calls at most ('' without one)
    ARGV[16] arguments        the call's arguments (JSON) to keep for a replay (§30.3), stored with `indexed`
    ARGV[17] replayOf         the task this one replays (§30.3), '' when none
    ARGV[18] fields           the first hash field's name; the fields' names and values follow, fieldCount entries in
                              all. Flat, not one JSON object: decoding JSON into the HSET was a quarter of this
                              script's own time (issue 46)

  Output:
    {R.OK, taskId, priority}                created; priority: its job's fair-share priority (0 when not entered)
    {R.IDEMPOTENT_REPLAY, existingId, tool} the key names a live task (a dedupe key: an unfinished one); nothing
                                            created
    {R.TASK_EXISTS}                         the id is taken
    {R.OPEN_CAP, count}                     the open-work set holds openMax or more (count) members; nothing
                                            created (the caller prunes ended work and may try once more)
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "fairShareEnter"
--- @include "transitions"

if ARGV[8] == '1' or ARGV[8] == '2' then
  local existing = redis.call('GET', KEYS[4])
  if existing then
    local h = redis.call('HMGET', ARGV[9] .. existing, F.tool, F.status)
    if h[1] and (ARGV[8] == '1' or not is_terminal(h[2])) then return {R.IDEMPOTENT_REPLAY, existing, h[1]} end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {R.TASK_EXISTS} end
-- The cap is checked and the task counted in the same step: concurrent creates cannot all pass it (§25).
if ARGV[12] ~= '' then
  local open = redis.call('ZCARD', KEYS[6])
  if open >= tonumber(ARGV[12]) then return {R.OPEN_CAP, open} end
end
-- The first status of a task: a creation, not a move, so it is the one status written outside move_status.
redis.call('HSET', KEYS[1], unpack(ARGV, 18, 17 + tonumber(ARGV[1])))
-- A replay (§30.3) is linked both ways in the same step: the original, if it is still kept, names its newest replay.
local original = ARGV[17]
if original ~= '' and redis.call('EXISTS', ARGV[9] .. original) == 1 then
  redis.call('HSET', ARGV[9] .. original, F.replayedBy, ARGV[3])
end
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[3])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[7], tonumber(ARGV[2]), ARGV[3])
  if ARGV[16] ~= '' then redis.call('SET', KEYS[8], ARGV[16]) end
  redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[3])
  local cap = tonumber(ARGV[6])
  if redis.call('ZCARD', KEYS[2]) > cap then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(cap + 1)) end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[7]))
end
if ARGV[8] == '1' then redis.call('SET', KEYS[4], ARGV[3]) end
if ARGV[8] == '2' then redis.call('SET', KEYS[4], ARGV[3], 'PX', tonumber(ARGV[15])) end
if ARGV[12] ~= '' then
  redis.call('ZADD', KEYS[6], tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[6], tonumber(ARGV[13]))
end
-- The job's place in its principal's share, in the same step: its add follows, with this priority (§25).
local priority = 0
if ARGV[10] ~= '' then priority = fair_share_enter(KEYS[5], ARGV[3], ARGV[10], ARGV[11], ARGV[14]) end
return {R.OK, ARGV[3], priority}
