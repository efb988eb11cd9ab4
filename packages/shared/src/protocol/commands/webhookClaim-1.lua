--[[
  Leases due webhook events to one gateway (PROTOCOL.md §27.3), fairly between principals and receivers. It walks the
  due events in order (at most `scan` of them), in two passes:
    1. one event of each principal with no try in flight on this gateway, oldest first (round robin: the principal
       that waited longest goes first, whoever holds the other slots);
    2. more events of principals below `perPrincipal` tries in flight, but only while more than `reserve` of the
       `batch` free slots stay free: those are kept for principals with nothing in flight.
  An event whose receiver is in `blocked` is not sent as usual: with a time there (the receiver's circuit is open),
  up to `deferMax` of them are leased too and returned apart, for the gateway to settle as a failed try that waits
  until then; with 0 (a probe of it is in flight) it is left due, untouched; with -1 (the circuit is half open) one
  event of that receiver is taken as its probe, at most `probes` in all, and the rest left due. A receiver in neither
  `blocked` nor `trusted` (one that has not answered this gateway yet, or has nothing in flight on it) gets one event
  in this claim, and `more` says that others of it were left due, so the gateway claims again at once, when the
  receiver has a try in flight and is either trusted or left alone until that try answers (slow start: before, the
  first round of tries to a receiver that hangs took up to `perPrincipal` slots, each until its timeout). Each event
  taken counts a try, is leased to `holder` (token `<holder>:<try>`) and is hidden until the lease ends. Redis server
  time, as the append uses.

  Input:
    KEYS[1] due               the outbox's due set (score: when due, ms)

    ARGV[1] batch             events to take at most (the free slots)
    ARGV[2] leaseMs           how long a try holds its event
    ARGV[3] holder            the claiming gateway's id
    ARGV[4] eventPrefix       what an event key puts before the event id
    ARGV[5] perPrincipal      tries one principal may have in flight on this gateway
    ARGV[6] inFlight          JSON {principal: tries in flight on this gateway}
    ARGV[7] scan              due events looked at, at most
    ARGV[8] reserve           free slots pass 2 leaves to principals with nothing in flight
    ARGV[9] blocked           JSON {receiver: ms until its circuit closes, or 0}
    ARGV[10] deferMax         blocked events leased for deferral, at most
    ARGV[11] probes           half-open receivers probed by this claim, at most
    ARGV[12] trusted          JSON {receiver: 1}: receivers that answered this gateway and have a try in flight on it;
                              empty: no slow start, every receiver that is not blocked is trusted

  Output:
    {R.OK, rows, deferred, more}  flat HGETALL lists: the events to try, and the events to defer; more is 1 when
                              events were left due only because their receiver had one taken already
]]
--- @include "resultCodes"
--- @include "webhookLimits"

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[1])
local leaseMs = tonumber(ARGV[2])
local cap = tonumber(ARGV[5])
local held = cjson.decode(ARGV[6])
local reserve = tonumber(ARGV[8])
local blocked = cjson.decode(ARGV[9])
local deferMax = tonumber(ARGV[10])
local probes = tonumber(ARGV[11])
local slowStart = ARGV[12] ~= ''
local trusted = slowStart and cjson.decode(ARGV[12]) or {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[7]))

local out, deferred, later = {}, {}, {}
-- Receivers given their one event of this claim (slow start), and whether another of theirs was left for that.
local once, more = {}, 0

-- The receiver of a URL as the gateway names it (receiver-health.ts `receiverOf`): lower-cased scheme://authority.
local function receiverOf(url)
  return string.lower(string.match(url, '^[%a][%w+.-]*://[^/?#]*') or url)
end

local function lease(id)
  local key = ARGV[4] .. id
  local try = redis.call('HINCRBY', key, W.attempts, 1)
  redis.call('HSET', key, W.lease, ARGV[3] .. ':' .. try)
  redis.call('ZADD', KEYS[1], now + leaseMs, id)
  return redis.call('HGETALL', key)
end

-- 'take', 'skip' or 'defer' for an event of `receiver`; a probe taken closes its receiver to this claim's others.
local function gate(receiver)
  local until_ = tonumber(blocked[receiver])
  if until_ == nil then return (trusted[receiver] or not slowStart) and 'take' or 'once' end
  if until_ > 0 then return 'defer' end
  if until_ == -1 and probes > 0 then return 'probe' end
  if once[receiver] then more = 1 end
  return 'skip'
end

local function take(id, principal, receiver, g)
  held[principal] = (tonumber(held[principal]) or 0) + 1
  if g == 'probe' then
    blocked[receiver] = 0
    probes = probes - 1
  elseif g == 'once' then
    blocked[receiver] = 0
    once[receiver] = true
  end
  out[#out + 1] = lease(id)
end

for _, id in ipairs(due) do
  if #out >= batch and #deferred >= deferMax then break end
  local fields = redis.call('HMGET', ARGV[4] .. id, W.principal, W.url)
  local principal, url = fields[1], fields[2]
  if not principal then
    redis.call('ZREM', KEYS[1], id)
  else
    local receiver = receiverOf(url or '')
    local g = gate(receiver)
    if g == 'defer' then
      if #deferred < deferMax then deferred[#deferred + 1] = lease(id) end
    elseif g ~= 'skip' then
      if (tonumber(held[principal]) or 0) == 0 and #out < batch then
        take(id, principal, receiver, g)
      else
        later[#later + 1] = {id, principal, receiver}
      end
    end
  end
end
for _, e in ipairs(later) do
  if batch - #out <= reserve then break end
  local g = gate(e[3])
  if (g == 'take' or g == 'probe' or g == 'once') and (tonumber(held[e[2]]) or 0) < cap then take(e[1], e[2], e[3], g) end
end
return {R.OK, out, deferred, more}
