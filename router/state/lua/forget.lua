local lru = P .. ':lru:' .. A.instance
local members = redis.call('ZRANGE', lru, 0, -1)
unhold(A.instance, members)
redis.call('DEL', lru)
return #members
