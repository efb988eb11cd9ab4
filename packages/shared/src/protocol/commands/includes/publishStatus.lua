--[[
  Publishes a status event to the gateway that owns the task and to every watcher, once each (PROTOCOL.md §6, §10.9),
  with the caller's publish command (§1.2: `SPUBLISH` in the sharded layout, on the gateways' channels of the task's
  shard). `known`: the task's {gatewayId, watchers} as the caller already read them (one HMGET per script, issue 46),
  or nil to read them here.
]]
--- @include "taskFields"
--- @include "publishCommand"

local function publish_status(taskKey, event, channelPrefix, channelSuffix, publish, known)
  local command = publish_command(publish)
  local h = known or redis.call('HMGET', taskKey, F.gatewayId, F.watchers)
  local payload = cjson.encode(event)
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
