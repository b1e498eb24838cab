-- Writes that need no answer, batched: ARGV[3..] are pairs (op, booking id), op 'P' for
-- prefill done (first byte) and 'R' for release. No JSON: plain strings in, a count out.
local function prefill_done(id)
  local bk = P .. ':bk:' .. id
  local v = redis.call('HMGET', bk, 'legs', 'pfdone')
  if not v[1] or v[2] == '1' then return 0 end
  redis.call('HSET', bk, 'pfdone', '1')
  for _, leg in ipairs(cjson.decode(v[1])) do
    if leg.transient then
      add_load(leg.instance, -1, -leg.prefill_tokens, -leg.kv_tokens, -leg.transfers, -(leg.transfer_bytes or 0))
    else
      add_load(leg.instance, 0, -leg.prefill_tokens, 0, -leg.transfers, -(leg.transfer_bytes or 0))
    end
  end
  return 1
end

local applied = 0
for i = 3, #ARGV, 2 do
  local op, id = ARGV[i], ARGV[i + 1]
  if op == 'P' then
    applied = applied + prefill_done(id)
  elseif op == 'R' then
    applied = applied + drop_booking(id)
  end
end
return applied
