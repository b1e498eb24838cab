-- A fresher view disagreed with the choice: move the booking (same id) elsewhere, and
-- take back the prefix blocks the first choice's instances did not hold before.
local now = now_ms()
drop_booking(A.booking.id)
undo_residency(A.undo)
book(A.booking, now, A.lease_ms, A.ttl_ms, A.caps)
return 1
