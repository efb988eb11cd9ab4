--[[
  An operator sends dead webhook events again (PROTOCOL.md §27.6): each chosen dead letter becomes a due event once
  more, with the same event id (a receiver that had it already drops the copy, as Standard Webhooks intends), its
  tries counted from 0, and leaves the dead letters. Redis server time.

  Input:
    KEYS[1] due               the outbox's due set
    KEYS[2] pending           pending events per principal
    KEYS[3] dead              the dead letters (newest first)

    ARGV[1] eventPrefix       what an event key puts before the event id
    ARGV[2] id                the event to send again; '' = every dead letter, newest first, up to `max`
    ARGV[3] max               the most events one call sends again

  Output:
    {R.OK, id, ...}           the events due again (none: no such dead letter, or it had no URL)
]]
--- @include "resultCodes"
--- @include "webhookLimits"

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {R.OK}
local max = tonumber(ARGV[3])
for _, raw in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if #reply - 1 >= max then break end
  local ok, letter = pcall(cjson.decode, raw)
  if ok and type(letter) == 'table' and (ARGV[2] == '' or letter.id == ARGV[2]) then
    redis.call('LREM', KEYS[3], 1, raw)
    if type(letter.url) == 'string' and letter.url ~= '' and type(letter.id) == 'string' then
      local principal = letter.principal or ''
      local fields = {W.id, letter.id, W.taskId, letter.taskId or '', W.principal, principal, W.url, letter.url,
        W.status, letter.status or '', W.timestamp, letter.timestamp or '', W.attempts, '0',
        W.createdAt, tostring(now)}
      if type(letter.statusMessage) == 'string' and letter.statusMessage ~= '' then
        fields[#fields + 1] = W.statusMessage
        fields[#fields + 1] = letter.statusMessage
      end
      redis.call('HSET', ARGV[1] .. letter.id, unpack(fields))
      redis.call('ZADD', KEYS[1], now, letter.id)
      redis.call('HINCRBY', KEYS[2], principal, 1)
      reply[#reply + 1] = letter.id
    end
    if ARGV[2] ~= '' then break end
  end
end
return reply
