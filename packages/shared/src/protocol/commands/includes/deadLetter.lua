-- A webhook event that will not be delivered joins the dead letters, newest first; at most
-- WEBHOOK_DEAD_LETTERS_KEPT are kept (one bound, for the outbox's append and its settle alike).
--- @include "webhookLimits"

local function dead_letter(key, letter)
  redis.call('LPUSH', key, cjson.encode(letter))
  redis.call('LTRIM', key, 0, WEBHOOK_DEAD_LETTERS_KEPT - 1)
end
