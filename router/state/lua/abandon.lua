-- The request failed before reaching an engine: release it and take back the prefix
-- blocks it recorded on instances that did not hold them before.
local dropped = drop_booking(A.id)
undo_residency(A.undo)
return dropped
