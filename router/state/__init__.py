"""Residency and booked load, in memory or in Redis, behind one StateStore interface."""

from router.state.base import Booking, Chooser, Load, Snapshot, StateStore
from router.state.memory import MemoryStore

__all__ = ["Booking", "Chooser", "Load", "MemoryStore", "Snapshot", "StateStore"]
