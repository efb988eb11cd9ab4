--[[
  Publishes a status event to the gateway that owns the task and to every watcher, once each (PROTOCOL.md §6, §10.9),
  with the caller's publish command (§1.2: `SPUBLISH` in the sharded layout, on the gateways' channels of the task's
  shard). `known`: the task's {gatewayId, watchers} as the caller already read them (one HMGET per script, issue 46),
  or nil to read them here. `raw`: members to add as they are (see below), or nil.
]]
--- @include "taskFields"
--- @include "publishCommand"

local function publish_status(taskKey, event, channelPrefix, channelSuffix, publish, known, raw)
  local command = publish_command(publish)
  local h = known or redis.call('HMGET', taskKey, F.gatewayId, F.watchers)
  local payload = cjson.encode(event)
  -- `raw`: more members of the event, already JSON (`,"name":<value>`), written as they are: the outcome a terminal
  -- event carries is JSON text the caller holds, which encoding would escape again, in Redis (§6.7, issue 46).
  if raw and raw ~= '' then payload = string.sub(payload, 1, -2) .. raw .. '}' end
  local sent = {}
  local function send(id)
    if id and id ~= '' and not sent[id] then
      sent[id] = true
      redis.call(command, channelPrefix .. id .. channelSuffix, payload)
    end
  end
  send(h[1])
  if h[2] then
    for id in string.gmatch(h[2], '[^,]+') do send(id) end
  end
end
