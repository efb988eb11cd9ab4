/**
 * Lua scripts behind RedisTaskStore. Each runs atomically in Redis; together they are the only writers of a task
 * hash's status and progress (PROTOCOL.md §2, §6, §10). Key names come from keys.ts: scripts only append ids to the
 * prefixes they are given.
 */

/** Shared by the scripts that publish a status event: to the owning gateway and to every watcher, once each. */
const PUBLISH_STATUS = `
local function publish_status(taskKey, event, channelPrefix, channelSuffix)
  local h = redis.call('HMGET', taskKey, 'gatewayId', 'watchers')
  local payload = cjson.encode(event)
  local sent = {}
  local function send(id)
    if id and id ~= '' and not sent[id] then
      sent[id] = true
      redis.call('PUBLISH', channelPrefix .. id .. channelSuffix, payload)
    end
  end
  send(h[1])
  if h[2] then
    for id in string.gmatch(h[2], '[^,]+') do send(id) end
  end
end
`;

/** Shared by the scripts that end a task: expiry, out of the live set, idempotency mapping kept as long as the task. */
const FINISH = `
local function finish(taskKey, liveKey, taskId, dropIdempotency)
  local h = redis.call('HMGET', taskKey, 'ttl', 'idemKey')
  local ttl = tonumber(h[1]) or 60000
  redis.call('PEXPIRE', taskKey, ttl)
  redis.call('ZREM', liveKey, taskId)
  if h[2] and h[2] ~= '' then
    if dropIdempotency and redis.call('GET', h[2]) == taskId then
      redis.call('DEL', h[2])
    else
      redis.call('PEXPIRE', h[2], ttl)
    end
  end
end
`;

/**
 * Shared by the scripts that move a task to `input_required` or a terminal status (PROTOCOL.md §27.2): when the task
 * names a webhook, its event joins the outbox in the same script as the status write. Scores are Redis server time,
 * so gateways with skewed clocks agree on what is due. An event that would take the principal past the cap the task
 * carries is dead-lettered at once.
 */
const OUTBOX_APPEND = `
local function outbox_append(taskKey, status, message, timestamp, dueKey, pendingKey, deadKey, eventPrefix)
  local h = redis.call('HMGET', taskKey, 'webhook', 'principal', 'taskId', 'webhookCap')
  if not h[1] or h[1] == '' then return end
  local principal = h[2] or ''
  local n = redis.call('HINCRBY', taskKey, 'webhookSeq', 1)
  local id = 'msg_' .. h[3] .. '_' .. n
  local t = redis.call('TIME')
  local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local cap = tonumber(h[4])
  local held = tonumber(redis.call('HGET', pendingKey, principal)) or 0
  if cap and held >= cap then
    redis.call('LPUSH', deadKey, cjson.encode({id = id, taskId = h[3], principal = principal, url = h[1],
      status = status, attempts = 0, reason = 'pending cap reached: ' .. held .. ' events of this principal not settled',
      deadAt = nowMs}))
    redis.call('LTRIM', deadKey, 0, 999)
    return
  end
  local fields = {'id', id, 'taskId', h[3], 'principal', principal, 'url', h[1], 'status', status,
    'timestamp', timestamp, 'attempts', '0', 'createdAt', tostring(nowMs)}
  if message and message ~= '' then
    fields[#fields + 1] = 'statusMessage'
    fields[#fields + 1] = message
  end
  redis.call('HSET', eventPrefix .. id, unpack(fields))
  redis.call('ZADD', dueKey, nowMs, id)
  redis.call('HINCRBY', pendingKey, principal, 1)
end
`;

/**
 * KEYS: 1 task, 2 principal index, 3 live set, 4 idempotency key (or the task key when there is none).
 * ARGV: 1 fields JSON, 2 createdAt ms, 3 taskId, 4 first reaper look (ms), 5 '1' to index the task, 6 index cap,
 * 7 index ttl ms, 8 '1' when KEYS[4] is an idempotency key, 9 task key prefix.
 * Returns {1, taskId} created; {0, existingId, existingTool} when the idempotency key names a live task; {-1} when
 * the id is taken.
 */
export const CREATE_SCRIPT = `
if ARGV[8] == '1' then
  local existing = redis.call('GET', KEYS[4])
  if existing then
    local tool = redis.call('HGET', ARGV[9] .. existing, 'tool')
    if tool then return {0, existing, tool} end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1} end
local fields = cjson.decode(ARGV[1])
local args = {}
for k, v in pairs(fields) do
  args[#args + 1] = k
  args[#args + 1] = v
end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[3])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[3])
  local cap = tonumber(ARGV[6])
  if redis.call('ZCARD', KEYS[2]) > cap then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(cap + 1)) end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[7]))
end
if ARGV[8] == '1' then redis.call('SET', KEYS[4], ARGV[3]) end
return {1, ARGV[3]}
`;

/**
 * KEYS: 1 task, 2 live set, 3 the job's lock key (or the task key when the write is not a worker's), 4 webhook due set,
 * 5 webhook pending counts, 6 webhook dead letters.
 * ARGV: 1 new status, 2 now (ISO), 3 allowed sources (comma list), 4 '1' when the new status is terminal,
 * 5 extra fields JSON, 6 lock token ('' = no lock check), 7 gateway channel prefix, 8 gateway channel suffix,
 * 9 ackTo gateway id or '', 10 new deadlineAt ms or '', 11 '1' to free the idempotency key at once, 12 '1' when the
 * event carries the outcome, 13 webhook event key prefix.
 * Returns {1, new status}, {0, current status or ''} when the state machine refuses, {-1, current} when the lock is
 * not held with that token.
 */
export const TRANSITION_SCRIPT = `${PUBLISH_STATUS}${FINISH}${OUTBOX_APPEND}
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return {0, ''} end
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then return {-1, current} end
local allowed = false
for s in string.gmatch(ARGV[3], '[^,]+') do
  if s == current then allowed = true end
end
if not allowed then return {0, current} end
local extra = cjson.decode(ARGV[5])
local args = {'status', ARGV[1], 'lastUpdatedAt', ARGV[2]}
for k, v in pairs(extra) do
  args[#args + 1] = k
  args[#args + 1] = v
end
if ARGV[10] ~= '' then
  args[#args + 1] = 'deadlineAt'
  args[#args + 1] = ARGV[10]
end
redis.call('HSET', KEYS[1], unpack(args))
local taskId = redis.call('HGET', KEYS[1], 'taskId')
local event = {type = 'status', taskId = taskId, status = ARGV[1], lastUpdatedAt = ARGV[2]}
local message = redis.call('HGET', KEYS[1], 'statusMessage')
if message and message ~= '' then event.statusMessage = message end
if extra.cancelReason then event.cancelReason = extra.cancelReason end
if ARGV[9] ~= '' then event.ackTo = ARGV[9] end
if ARGV[12] == '1' then
  event.final = true
  event.result = extra.result
  event.error = extra.error
end
publish_status(KEYS[1], event, ARGV[7], ARGV[8])
if ARGV[4] == '1' or (ARGV[1] == 'input_required' and current ~= 'input_required') then
  outbox_append(KEYS[1], ARGV[1], message, ARGV[2], KEYS[4], KEYS[5], KEYS[6], ARGV[13])
end
if ARGV[4] == '1' then
  finish(KEYS[1], KEYS[2], taskId, ARGV[11] == '1')
  redis.call('HDEL', KEYS[1], 'watchers')
end
return {1, ARGV[1]}
`;

/**
 * KEYS: 1 task, 2 the job's lock key.
 * ARGV: 1 progress, 2 total or '', 3 message JSON or '', 4 now (ISO), 5 gateway channel prefix,
 * 6 gateway channel suffix, 7 terminal statuses (comma list), 8 lock token ('' = no lock check).
 * Returns 1 accepted, 0 not increasing, -1 missing, -2 terminal, -3 lock not held.
 */
export const PROGRESS_SCRIPT = `
local h = redis.call('HMGET', KEYS[1], 'status', 'progress', 'gatewayId', 'taskId')
if not h[1] then return -1 end
for s in string.gmatch(ARGV[7], '[^,]+') do
  if s == h[1] then return -2 end
end
if ARGV[8] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[8] then return -3 end
local progress = tonumber(ARGV[1])
if h[2] and tonumber(h[2]) >= progress then return 0 end
local event = {type = 'progress', taskId = h[4], progress = progress}
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

/**
 * A tool's log message (PROTOCOL.md §15): published on the owning gateway's channel, never stored; refused for a
 * missing or terminal task and, lock-checked, for a run that lost its job. The payload is built here around the
 * caller's JSON so the data is not decoded and encoded again.
 * KEYS: 1 task, 2 the job's lock key. ARGV: 1 level, 2 data JSON, 3 logger JSON or '', 4 gateway channel prefix,
 * 5 gateway channel suffix, 6 terminal statuses (comma list), 7 lock token ('' = no lock check).
 * Returns 1 published, 0 no gateway holds the caller's session, -1 missing, -2 terminal, -3 lock not held.
 */
export const LOG_SCRIPT = `
local h = redis.call('HMGET', KEYS[1], 'status', 'gatewayId', 'taskId')
if not h[1] then return -1 end
for s in string.gmatch(ARGV[6], '[^,]+') do
  if s == h[1] then return -2 end
end
if ARGV[7] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[7] then return -3 end
if not h[2] or h[2] == '' then return 0 end
local payload = '{"type":"log","taskId":' .. cjson.encode(h[3]) .. ',"level":' .. cjson.encode(ARGV[1]) ..
  ',"data":' .. ARGV[2]
if ARGV[3] ~= '' then payload = payload .. ',"logger":' .. ARGV[3] end
redis.call('PUBLISH', ARGV[4] .. h[2] .. ARGV[5], payload .. '}')
return 1
`;

/**
 * A run starts (PROTOCOL.md §10.2): the lock holder records it and moves the deadline.
 * KEYS: 1 task, 2 the job's lock key. ARGV: 1 lock token, 2 deadlineAt ms, 3 now (ISO), 4 attempt,
 * 5 terminal statuses (comma list).
 * Returns the hash as a flat list (empty when missing); {'__lock_lost'} when the lock is not held.
 */
export const START_SCRIPT = `
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {} end
local terminal = false
for s in string.gmatch(ARGV[5], '[^,]+') do
  if s == status then terminal = true end
end
if not terminal then
  if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'__lock_lost'} end
  -- A run replaying while its input request is still pending keeps the input deadline (§12.2).
  if status ~= 'input_required' then redis.call('HSET', KEYS[1], 'deadlineAt', ARGV[2]) end
  redis.call('HSET', KEYS[1], 'attempt', ARGV[4])
  if redis.call('HEXISTS', KEYS[1], 'startedAt') == 0 then redis.call('HSET', KEYS[1], 'startedAt', ARGV[3]) end
end
return redis.call('HGETALL', KEYS[1])
`;

/**
 * Reads a task and, while it is not terminal, registers a gateway to be told of its status changes (a waiter).
 * KEYS: 1 task. ARGV: 1 gateway id, 2 terminal statuses (comma list).
 * Returns the hash as a flat list (empty when missing).
 */
export const WATCH_SCRIPT = `
local h = redis.call('HGETALL', KEYS[1])
if #h == 0 then return h end
local status, owner, watchers
for i = 1, #h, 2 do
  if h[i] == 'status' then status = h[i + 1] elseif h[i] == 'gatewayId' then owner = h[i + 1]
  elseif h[i] == 'watchers' then watchers = h[i + 1] end
end
for s in string.gmatch(ARGV[2], '[^,]+') do
  if s == status then return h end
end
if owner == ARGV[1] then return h end
if watchers then
  for id in string.gmatch(watchers, '[^,]+') do
    if id == ARGV[1] then return h end
  end
  redis.call('HSET', KEYS[1], 'watchers', watchers .. ',' .. ARGV[1])
else
  redis.call('HSET', KEYS[1], 'watchers', ARGV[1])
end
return h
`;

/**
 * The reaper (PROTOCOL.md §10.3): fails due tasks whose deadline passed or whose job is gone or failed.
 * KEYS: 1 live set, 2 reaper lease, 3 webhook due set, 4 webhook pending counts, 5 webhook dead letters.
 * ARGV: 1 now ms, 2 now (ISO), 3 batch size, 4 look-again interval ms, 5 task key prefix, 6 BullMQ queue key prefix,
 * 7 gateway channel prefix, 8 gateway channel suffix, 9 lease holder, 10 lease ms, 11 terminal statuses,
 * 12 webhook event key prefix.
 * Returns {looked, {taskId, code, message, ...}} or {-1} when another process holds the lease.
 */
export const REAP_SCRIPT = `${PUBLISH_STATUS}${FINISH}${OUTBOX_APPEND}
if redis.call('SET', KEYS[2], ARGV[9], 'NX', 'PX', tonumber(ARGV[10])) == false then
  if redis.call('GET', KEYS[2]) ~= ARGV[9] then return {-1} end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[10]))
end
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local reaped = {}
for _, taskId in ipairs(due) do
  local taskKey = ARGV[5] .. taskId
  local h = redis.call('HMGET', taskKey, 'status', 'deadlineAt', 'queue', 'startedAt')
  local terminal = (h[1] == false)
  if not terminal then
    for s in string.gmatch(ARGV[11], '[^,]+') do
      if s == h[1] then terminal = true end
    end
  end
  if terminal then
    redis.call('ZREM', KEYS[1], taskId)
  else
    local deadline = tonumber(h[2])
    local code, message
    if deadline and now >= deadline then
      code = 'TIMEOUT'
      if h[1] == 'input_required' then
        message = 'Task deadline passed: its input request was not answered in time'
      else
        message = 'Task deadline passed: no worker finished it in time'
      end
    else
      local jobKey = ARGV[6] .. (h[3] or '') .. ':' .. taskId
      if redis.call('EXISTS', jobKey) == 0 then
        code = 'JOB_LOST'
        message = 'The job of this task was lost (never enqueued, evicted or removed)'
      elseif redis.call('ZSCORE', ARGV[6] .. (h[3] or '') .. ':failed', taskId) then
        code = 'JOB_LOST'
        local reason = redis.call('HGET', jobKey, 'failedReason')
        message = 'The job of this task failed: ' .. (reason or 'unknown reason')
      end
    end
    if code then
      local result = cjson.encode({content = {{type = 'text', text = message}}, isError = true})
      local err = cjson.encode({code = code, message = message})
      redis.call('HSET', taskKey, 'status', 'failed', 'statusMessage', message, 'lastUpdatedAt', ARGV[2],
        'result', result, 'error', err)
      publish_status(taskKey, {type = 'status', taskId = taskId, status = 'failed', statusMessage = message,
        lastUpdatedAt = ARGV[2]}, ARGV[7], ARGV[8])
      outbox_append(taskKey, 'failed', message, ARGV[2], KEYS[3], KEYS[4], KEYS[5], ARGV[12])
      finish(taskKey, KEYS[1], taskId, h[4] == false)
      redis.call('HDEL', taskKey, 'watchers')
      reaped[#reaped + 1] = taskId
      reaped[#reaped + 1] = code
      reaped[#reaped + 1] = message
    else
      local again = now + tonumber(ARGV[4])
      if deadline and deadline < again then again = deadline end
      redis.call('ZADD', KEYS[1], again, taskId)
    end
  end
end
return {#due, reaped}
`;

/**
 * One page of a principal's index, newest first, after a (score, id) cursor: stable while tasks are added.
 * KEYS: 1 index. ARGV: 1 cursor score or '' for the first page, 2 cursor id, 3 limit.
 * Returns {id, score, id, score, ...} with at most limit + 1 entries (one more tells there is a next page).
 */
export const LIST_SCRIPT = `
local limit = tonumber(ARGV[3])
local out = {}
if ARGV[1] == '' then
  local rows = redis.call('ZRANGE', KEYS[1], '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit + 1, 'WITHSCORES')
  return rows
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
return out
`;

/**
 * A run suspends (PROTOCOL.md §12): lock-checked. With input requests (one or several asked at once) it stores each
 * one not yet answered, adds it to the pending list (`pendingInput`, a comma list of request numbers), moves the task
 * to `input_required` (a status event carrying `inputRequestId`, the newly pending numbers) and sets the input
 * deadline. Requests already answered are returned instead. A timed suspension only moves the deadline.
 * KEYS: 1 task, 2 the job's lock key, 3 webhook due set, 4 webhook pending counts, 5 webhook dead letters.
 * ARGV: 1 lock token, 2 requests JSON (`[[n, requestJSON], ...]`, '' = timed), 3 now (ISO), 4 deadlineAt ms,
 * 5 gateway channel prefix, 6 gateway channel suffix, 7 terminal statuses, 8 webhook event key prefix.
 * Returns {1, answers} where answers is a flat list {n, answerJSON, ...} of the requests already answered (the run
 * suspends when not all are); {0, status or ''} missing or terminal; {-1} lock not held.
 */
export const SUSPEND_SCRIPT = `${PUBLISH_STATUS}${OUTBOX_APPEND}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {0, ''} end
for s in string.gmatch(ARGV[7], '[^,]+') do
  if s == status then return {0, status} end
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {-1} end
if ARGV[2] == '' then
  redis.call('HSET', KEYS[1], 'deadlineAt', ARGV[4])
  return {1, {}}
end
local requests = cjson.decode(ARGV[2])
local pendingRaw = redis.call('HGET', KEYS[1], 'pendingInput') or ''
local pending = {}
local order = {}
for id in string.gmatch(pendingRaw, '[^,]+') do
  pending[id] = true
  order[#order + 1] = id
end
local answers = {}
local added = {}
for _, r in ipairs(requests) do
  local n = tostring(r[1])
  local answer = redis.call('HGET', KEYS[1], 'answer:' .. n)
  if answer then
    answers[#answers + 1] = n
    answers[#answers + 1] = answer
  elseif not pending[n] then
    redis.call('HSET', KEYS[1], 'input:' .. n, r[2])
    pending[n] = true
    order[#order + 1] = n
    added[#added + 1] = n
  end
end
if #added > 0 then
  redis.call('HSET', KEYS[1], 'pendingInput', table.concat(order, ','), 'status', 'input_required',
    'lastUpdatedAt', ARGV[3], 'deadlineAt', ARGV[4])
  local taskId = redis.call('HGET', KEYS[1], 'taskId')
  local event = {type = 'status', taskId = taskId, status = 'input_required', lastUpdatedAt = ARGV[3],
    inputRequestId = table.concat(added, ',')}
  local message = redis.call('HGET', KEYS[1], 'statusMessage')
  if message and message ~= '' then event.statusMessage = message end
  publish_status(KEYS[1], event, ARGV[5], ARGV[6])
  -- Another question while the task already waits is no status change: no second event.
  if status ~= 'input_required' then
    outbox_append(KEYS[1], 'input_required', message, ARGV[3], KEYS[3], KEYS[4], KEYS[5], ARGV[8])
  end
end
return {1, answers}
`;

/**
 * An answer to input request `n` (PROTOCOL.md §12.3): accepted only while `n` is pending. When it was the last one
 * pending the task is back to `working` with the run deadline (status event); otherwise it stays `input_required`.
 * KEYS: 1 task. ARGV: 1 request number, 2 answer JSON, 3 now (ISO), 4 deadlineAt ms, 5 gateway channel prefix,
 * 6 gateway channel suffix.
 * Returns {1, queue, 1 when the task is working again else 0}; {0, status} not pending (answered already, never
 * asked, or the task moved on); {0, ''} missing.
 */
export const ANSWER_SCRIPT = `${PUBLISH_STATUS}
local h = redis.call('HMGET', KEYS[1], 'status', 'pendingInput', 'taskId', 'queue')
if not h[1] then return {0, ''} end
if h[1] ~= 'input_required' or redis.call('HEXISTS', KEYS[1], 'answer:' .. ARGV[1]) == 1 then return {0, h[1]} end
local rest = {}
local found = false
for id in string.gmatch(h[2] or '', '[^,]+') do
  if id == ARGV[1] then found = true else rest[#rest + 1] = id end
end
if not found then return {0, h[1]} end
redis.call('HSET', KEYS[1], 'answer:' .. ARGV[1], ARGV[2], 'lastUpdatedAt', ARGV[3])
if #rest > 0 then
  redis.call('HSET', KEYS[1], 'pendingInput', table.concat(rest, ','))
  return {1, h[4] or '', 0}
end
redis.call('HSET', KEYS[1], 'status', 'working', 'deadlineAt', ARGV[4])
redis.call('HDEL', KEYS[1], 'pendingInput')
publish_status(KEYS[1], {type = 'status', taskId = h[3], status = 'working', lastUpdatedAt = ARGV[3]}, ARGV[5],
  ARGV[6])
return {1, h[4] or '', 1}
`;

/**
 * A run writes its durable state (PROTOCOL.md §12.1): lock-checked, refused once the task is terminal.
 * KEYS: 1 task, 2 the job's lock key. ARGV: 1 lock token, 2 field ('state' or 'steps'), 3 JSON, 4 terminal statuses.
 * Returns 1 written, 0 missing or terminal, -1 lock not held.
 */
export const SET_STATE_SCRIPT = `
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
for s in string.gmatch(ARGV[4], '[^,]+') do
  if s == status then return 0 end
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
`;
