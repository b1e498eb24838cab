-- Extend the leases of bookings still alive in this replica; sweep expired ones.
local now = now_ms()
local expiry = now + A.lease_ms
local kept = 0
for _, id in ipairs(A.ids) do
  kept = kept + redis.call('ZADD', P .. ':leases', 'XX', 'CH', expiry, id)
end
sweep(now)
return kept
