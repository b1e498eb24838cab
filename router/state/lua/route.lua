-- Look up, then book: one round trip per routing decision. Returns the view *before*
-- this booking so the caller can check its choice against it. The booking's keys are
-- usually the request's (A.same_keys): then they are sent once.
local now = now_ms()
sweep(now)
local view = lookup(A.instances, A.keys, now)
local held = {}
for i, inst in ipairs(A.instances) do held[inst] = view.matched[i] end
if A.same_keys then A.booking.keys = A.keys end
book(A.booking, now, A.lease_ms, A.ttl_ms, A.caps, held)
return cjson.encode(view)
