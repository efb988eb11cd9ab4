--[[
  A run starts (PROTOCOL.md §10.2): the lock holder records the attempt and moves the deadline. A terminal task is
  returned as it is, unchanged and without a lock check (the run then ends without running the tool). Unless the
  lock is another run's, the job leaves its principal's waiting share of the pool (§25) in the same step: it is
  taken, whatever happens next.
  Tool versions (§12.11): the run records the version it runs; with deferIfOther it does not start a task that records
  another version (it answers VERSION_OTHER and writes nothing but the share), and with reset it clears the task's
  state, steps, questions and answers as it starts (onVersionChange: restart).

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key
    KEYS[3] share             the principal's fair share of the pool (the task key when the job names no principal)

    ARGV[1] lockToken         the worker's lock token
    ARGV[2] deadlineAt        the run's deadline, ms since epoch
    ARGV[3] now               ISO time
    ARGV[4] attempt           the run's number
    ARGV[5] jobId             the job's id in the share
    ARGV[6] toolVersion       the version of the tool this run runs ('' when the worker names none)
    ARGV[7] deferIfOther      '1': do not start when the task records another version
    ARGV[8] reset             '1': clear state, steps, questions and answers
    ARGV[9] brief             '1': a task that starts is answered without its hash (a first run, §21.2.1: its
                              context reads the record only when a member needs it; issue 46)

  Output:
    {R.OK, hash}        the hash as a flat list
    {R.OK}              brief, and the task started (not terminal)
    {R.TASK_MISSING}
    {R.LOCK_LOST}
    {R.VERSION_OTHER, recordedVersion}   nothing written (deferIfOther)
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"

local function leave_share()
  if KEYS[3] ~= KEYS[1] then redis.call('ZREM', KEYS[3], ARGV[5]) end
end

-- One read of the fields the start looks at, one write of those it sets (a Redis command per call counts, issue 46).
local h = redis.call('HMGET', KEYS[1], F.status, F.toolVersion, F.backOff, F.startedAt)
local status = h[1]
if not status then
  leave_share()
  return {R.TASK_MISSING}
end
if not is_terminal(status) then
  if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
  local recorded = h[2]
  if ARGV[7] == '1' and recorded and ARGV[6] ~= '' and recorded ~= ARGV[6] then
    leave_share()
    return {R.VERSION_OTHER, recorded}
  end
  if ARGV[8] == '1' then
    -- Request numbers are never reused (§12.2): the next question takes a number above every cleared one.
    local floor = tonumber(redis.call('HGET', KEYS[1], F.inputFloor) or '0') or 0
    local fields = redis.call('HKEYS', KEYS[1])
    for _, field in ipairs(fields) do
      if string.sub(field, 1, #F.input) == F.input then
        floor = math.max(floor, tonumber(string.sub(field, #F.input + 1)) or 0)
      end
      if field == F.state or field == F.steps or field == F.pendingInput
        or string.sub(field, 1, #F.input) == F.input or string.sub(field, 1, #F.answer) == F.answer then
        redis.call('HDEL', KEYS[1], field)
      end
    end
    redis.call('HSET', KEYS[1], F.inputFloor, floor)
  end
  local fields = {F.attempt, ARGV[4]}
  if ARGV[6] ~= '' then
    fields[#fields + 1] = F.toolVersion
    fields[#fields + 1] = ARGV[6]
  end
  -- A run replaying while its input request is still pending keeps the input deadline (§12.2).
  if status ~= 'input_required' then
    fields[#fields + 1] = F.deadlineAt
    fields[#fields + 1] = ARGV[2]
  end
  if not h[4] then
    fields[#fields + 1] = F.startedAt
    fields[#fields + 1] = ARGV[3]
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  -- A back-off is over once a run starts (§3.4): its message goes with it.
  if h[3] then redis.call('HDEL', KEYS[1], F.backOff, F.statusMessage) end
  if ARGV[9] == '1' then
    leave_share()
    return {R.OK}
  end
end
leave_share()
return {R.OK, redis.call('HGETALL', KEYS[1])}
