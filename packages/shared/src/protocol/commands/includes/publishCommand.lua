--[[
  The publish command a caller names (PROTOCOL.md §1.2): `SPUBLISH` in the sharded layout, whose channels hash with the
  task's shard, so a message goes to that shard's master only; anything else (`PUBLISH`, or '' from a caller that
  predates the argument) publishes with the classic `PUBLISH`.
]]
local function publish_command(name)
  if name == 'SPUBLISH' then return 'SPUBLISH' end
  return 'PUBLISH'
end
