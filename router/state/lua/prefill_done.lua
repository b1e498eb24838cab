-- First byte: the prefill queue and the KV transfer of this request are over.
local bk = P .. ':bk:' .. A.id
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
