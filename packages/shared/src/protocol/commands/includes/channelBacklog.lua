--[[
  The bound on what waits for one gateway on its channel (PROTOCOL.md §22.4). Each gateway keeps a hash
  `<backlogPrefix><gatewayId><backlogSuffix>` = {max, bytes}: `max` is its budget (below Redis's pub/sub output limit),
  `bytes` what tool messages published to it and not yet read add up to; it acknowledges what it reads. A tool message
  (progress, log) is published only when it fits: `backlog_admit` counts it and answers true, or answers false and
  counts nothing. A gateway without the hash (gone: it expires a minute after the gateway stops refreshing it) bounds
  nothing: nobody reads its channel, so Redis buffers nothing for it.
]]

-- As BACKLOG_MESSAGE_OVERHEAD in channel-backlog.ts: RESP framing besides the payload and the channel name.
local BACKLOG_MESSAGE_OVERHEAD = 64

-- `payloads` (a list) go out together or not at all.
local function backlog_admit(gatewayId, channel, payloads, backlogPrefix, backlogSuffix)
  local key = backlogPrefix .. gatewayId .. backlogSuffix
  local b = redis.call('HMGET', key, 'max', 'bytes')
  if not b[1] then return true end
  local cost = 0
  for _, payload in ipairs(payloads) do cost = cost + #payload + #channel + BACKLOG_MESSAGE_OVERHEAD end
  if (tonumber(b[2]) or 0) + cost > tonumber(b[1]) then return false end
  redis.call('HINCRBY', key, 'bytes', cost)
  return true
end
