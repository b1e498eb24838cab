-- Writes that need no answer, batched: ARGV[3..] are pairs (op, booking id), op 'L' for
-- the remote prefill leg done (its work stops queueing), 'P' for prefill done (first byte)
-- and 'R' for release. No JSON: plain strings in, a count out.
local function prefill_leg_done(id)
  local bk = P .. ':bk:' .. id
  local v = redis.call('HMGET', bk, 'legs', 'pfdone', 'lgdone')
  if not v[1] or v[2] == '1' or v[3] == '1' then return 0 end
  redis.call('HSET', bk, 'lgdone', '1')
  for _, leg in ipairs(cjson.decode(v[1])) do
    if leg.transient then add_load(leg.instance, 0, -leg.prefill_tokens, 0, 0, 0) end
  end
  return 1
end

local function prefill_done(id)
  local bk = P .. ':bk:' .. id
  local v = redis.call('HMGET', bk, 'legs', 'pfdone', 'lgdone')
  if not v[1] or v[2] == '1' then return 0 end
  redis.call('HSET', bk, 'pfdone', '1')
  for _, leg in ipairs(cjson.decode(v[1])) do
    if leg.transient then
      add_load(leg.instance, -1, queued_work(leg, v[3]), -leg.kv_tokens, -leg.transfers, -(leg.transfer_bytes or 0))
    else
      add_load(leg.instance, 0, -leg.prefill_tokens, 0, -leg.transfers, -(leg.transfer_bytes or 0))
    end
  end
  return 1
end

local applied = 0
for i = 3, #ARGV, 2 do
  local op, id = ARGV[i], ARGV[i + 1]
  if op == 'L' then
    applied = applied + prefill_leg_done(id)
  elseif op == 'P' then
    applied = applied + prefill_done(id)
  elseif op == 'R' then
    applied = applied + drop_booking(id)
  end
end
return applied
