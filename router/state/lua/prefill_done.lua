local bk = P .. ':bk:' .. A.id
local v = redis.call('HMGET', bk, 'inst', 'pf', 'pfdone')
if not v[1] or v[3] == '1' then return 0 end
redis.call('HSET', bk, 'pfdone', '1')
add_load(v[1], 0, -tonumber(v[2]), 0)
return 1
