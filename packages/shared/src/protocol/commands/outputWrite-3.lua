--[[
  A run writes its task's partial output (PROTOCOL.md §34.2): appends or replaces, keeps the newest maxBytes (cut on
  a UTF-8 character boundary), refreshes the key's expiry, and wakes the gateways' resource subscriptions.

  Input:
    KEYS[1] task              the task hash
    KEYS[2] lock              the job's lock key (the task key when the write is not a worker's)
    KEYS[3] output            the output string

    ARGV[1] lockToken         the worker's lock token; '' = no lock check
    ARGV[2] mode              'append' or 'set'
    ARGV[3] chunk             the text (UTF-8)
    ARGV[4] maxBytes          the most bytes the output keeps (its tail)
    ARGV[5] ttlMs             the output key's expiry after this write
    ARGV[6] channel           the resources channel
    ARGV[7] taskId            the task id, published on the channel
    ARGV[8] publish           the publish command: 'SPUBLISH' in the sharded layout, else PUBLISH (§1.2)

  Output:
    {R.OK, length}      written; the output's length in bytes
    {R.TASK_MISSING}
    {R.TASK_TERMINAL}
    {R.LOCK_LOST}
]]
--- @include "resultCodes"
--- @include "taskFields"
--- @include "transitions"
--- @include "checkLock"
--- @include "publishCommand"

local h = redis.call('HMGET', KEYS[1], F.status, F.sideKeys)
local status = h[1]
if not status then return {R.TASK_MISSING} end
if is_terminal(status) then return {R.TASK_TERMINAL} end
if not holds_lock(KEYS[2], ARGV[1]) then return {R.LOCK_LOST} end
-- The task has keys that end with it now: its end looks at them (finish.lua), and only then (issue 46).
if not h[2] then redis.call('HSET', KEYS[1], F.sideKeys, '1') end
local max = tonumber(ARGV[4])
local text
if ARGV[2] == 'append' then
  local length = redis.call('APPEND', KEYS[3], ARGV[3])
  if length > max then text = redis.call('GET', KEYS[3]) end
else
  text = ARGV[3]
  if #text <= max then redis.call('SET', KEYS[3], text) end
end
if text and #text > max then
  -- The tail is kept; UTF-8 continuation bytes (0x80..0xBF) at its start belong to a character cut off: dropped.
  local from = #text - max + 1
  while from <= #text do
    local b = string.byte(text, from)
    if b < 128 or b > 191 then break end
    from = from + 1
  end
  redis.call('SET', KEYS[3], string.sub(text, from))
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
redis.call(publish_command(ARGV[8]), ARGV[6], cjson.encode({taskId = ARGV[7]}))
return {R.OK, redis.call('STRLEN', KEYS[3])}
