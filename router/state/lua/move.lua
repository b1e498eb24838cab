-- A fresher view disagreed with the choice: move the booking (same id) elsewhere, and
-- take back the prefix blocks the first choice did not hold before it was booked.
local now = now_ms()
drop_booking(A.booking.id)
if #A.undo_keys > 0 then
  unhold(A.undo_instance, A.undo_keys)
  redis.call('ZREM', P .. ':lru:' .. A.undo_instance, unpack(A.undo_keys))
end
book(A.booking, now, A.lease_ms)
record(A.booking.instance, A.booking.keys, now, A.ttl_ms, A.cap)
return 1
