return drop_booking(A.id)
