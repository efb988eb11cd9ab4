/**
 * Lua scripts behind RedisTaskStore. Each runs atomically in Redis; together they are the only writers of a task
 * hash's status and progress (PROTOCOL.md §2, §6).
 */

/** KEYS: task, principal index. ARGV: fields JSON, createdAt ms, taskId. Returns 1, or 0 when the id exists. */
export const CREATE_SCRIPT = `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = cjson.decode(ARGV[1])
local args = {}
for k, v in pairs(fields) do
  args[#args + 1] = k
  args[#args + 1] = v
end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[3])
return 1
`;

/**
 * KEYS: task. ARGV: new status, now (ISO), allowed sources (comma list), '1' when the new status is terminal,
 * status channel, extra fields JSON. Returns {1, new status} or {0, current status or ''}.
 */
export const TRANSITION_SCRIPT = `
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return {0, ''} end
local allowed = false
for s in string.gmatch(ARGV[3], '[^,]+') do
  if s == current then allowed = true end
end
if not allowed then return {0, current} end
local args = {'status', ARGV[1], 'lastUpdatedAt', ARGV[2]}
for k, v in pairs(cjson.decode(ARGV[6])) do
  args[#args + 1] = k
  args[#args + 1] = v
end
redis.call('HSET', KEYS[1], unpack(args))
if ARGV[4] == '1' then
  redis.call('PEXPIRE', KEYS[1], tonumber(redis.call('HGET', KEYS[1], 'ttl')))
end
local event = {taskId = redis.call('HGET', KEYS[1], 'taskId'), status = ARGV[1], lastUpdatedAt = ARGV[2]}
local message = redis.call('HGET', KEYS[1], 'statusMessage')
if message and message ~= '' then event.statusMessage = message end
redis.call('PUBLISH', ARGV[5], cjson.encode(event))
return {1, ARGV[1]}
`;

/**
 * KEYS: task. ARGV: progress, total or '', message JSON or '', now (ISO), channel prefix, channel suffix,
 * terminal statuses (comma list). Returns 1 accepted, 0 not increasing, -1 missing, -2 terminal.
 */
export const PROGRESS_SCRIPT = `
local h = redis.call('HMGET', KEYS[1], 'status', 'progress', 'gatewayId', 'taskId')
if not h[1] then return -1 end
for s in string.gmatch(ARGV[7], '[^,]+') do
  if s == h[1] then return -2 end
end
local progress = tonumber(ARGV[1])
if h[2] and tonumber(h[2]) >= progress then return 0 end
local event = {taskId = h[4], progress = progress}
redis.call('HSET', KEYS[1], 'progress', ARGV[1], 'lastUpdatedAt', ARGV[4])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'total', ARGV[2])
  event.total = tonumber(ARGV[2])
else
  redis.call('HDEL', KEYS[1], 'total')
end
if ARGV[3] ~= '' then
  local message = cjson.decode(ARGV[3])
  redis.call('HSET', KEYS[1], 'progressMessage', message, 'statusMessage', message)
  event.message = message
end
if h[3] and h[3] ~= '' then
  redis.call('PUBLISH', ARGV[5] .. h[3] .. ARGV[6], cjson.encode(event))
end
return 1
`;
