--[[
  One page of a principal's index, newest first, after a (score, id) cursor: stable while tasks are added.

  Input:
    KEYS[1] index             the principal's task-mode index

    ARGV[1] cursorScore       the cursor's score, or '' for the first page
    ARGV[2] cursorId          the cursor's task id
    ARGV[3] limit             the page size

  Output:
    {R.OK, {id, score, id, score, ...}}   at most limit + 1 entries (one more tells there is a next page)
]]
--- @include "resultCodes"

local limit = tonumber(ARGV[3])
local out = {}
if ARGV[1] == '' then
  return {R.OK, redis.call('ZRANGE', KEYS[1], '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit + 1, 'WITHSCORES')}
end
local ties = redis.call('ZCOUNT', KEYS[1], ARGV[1], ARGV[1])
local rows = redis.call('ZRANGE', KEYS[1], ARGV[1], '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit + 1 + ties,
  'WITHSCORES')
local cursorScore = tonumber(ARGV[1])
for i = 1, #rows, 2 do
  local id, score = rows[i], tonumber(rows[i + 1])
  if score < cursorScore or id < ARGV[2] then
    out[#out + 1] = id
    out[#out + 1] = rows[i + 1]
    if #out >= 2 * (limit + 1) then break end
  end
end
return {R.OK, out}
