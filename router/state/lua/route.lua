-- Look up, then book: one round trip per routing decision. Returns the view *before*
-- this booking so the caller can check its choice against it.
local now = now_ms()
sweep(now)
local view = lookup(A.instances, A.keys, now)
book(A.booking, now, A.lease_ms, A.ttl_ms, A.caps)
return cjson.encode(view)
