--[[
  Completion webhooks (PROTOCOL.md §27.2): when the task names a webhook, its event joins the outbox in the same script
  as the status write (a move to input_required or a terminal status). Scores are Redis server time, so gateways with
  skewed clocks agree on what is due. An event that would take the principal past the cap the task carries is
  dead-lettered at once. The event hash's own fields (id, url, attempts, ...) are the outbox's, not the task's.
  `known`: the task's {webhook, principal, taskId, webhookCap} as the caller already read them (one HMGET per script,
  issue 46), or nil to read them here.
]]
--- @include "taskFields"
--- @include "webhookLimits"
--- @include "deadLetter"

local function outbox_append(taskKey, status, message, timestamp, dueKey, pendingKey, deadKey, eventPrefix, known)
  local h = known or redis.call('HMGET', taskKey, F.webhook, F.principal, F.taskId, F.webhookCap)
  if not h[1] or h[1] == '' then return end
  local principal = h[2] or ''
  local n = redis.call('HINCRBY', taskKey, F.webhookSeq, 1)
  local id = 'msg_' .. h[3] .. '_' .. n
  local t = redis.call('TIME')
  local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local cap = tonumber(h[4])
  local held = tonumber(redis.call('HGET', pendingKey, principal)) or 0
  if cap and held >= cap then
    dead_letter(deadKey, {id = id, taskId = h[3], principal = principal, url = h[1], status = status, attempts = 0,
      reason = 'pending cap reached: ' .. held .. ' events of this principal not settled', deadAt = nowMs,
      timestamp = timestamp, statusMessage = (message and message ~= '') and message or nil})
    return
  end
  local fields = {W.id, id, W.taskId, h[3], W.principal, principal, W.url, h[1], W.status, status,
    W.timestamp, timestamp, W.attempts, '0', W.createdAt, tostring(nowMs)}
  if message and message ~= '' then
    fields[#fields + 1] = W.statusMessage
    fields[#fields + 1] = message
  end
  redis.call('HSET', eventPrefix .. id, unpack(fields))
  redis.call('ZADD', dueKey, nowMs, id)
  redis.call('HINCRBY', pendingKey, principal, 1)
end
