local lru = P .. ':lru:' .. A.instance
local members = redis.call('ZRANGE', lru, 0, -1)
unhold(A.instance, members)
redis.call('DEL', lru)
if A.drop_load then redis.call('HDEL', P .. ':loads', A.instance) end
return #members
