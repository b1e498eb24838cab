"""Layer: state. Residency ("who holds which leading blocks") and booked load, in memory or
shared through Redis by router replicas, behind one StateStore contract.

May import: router.core, router.config. Knows nothing of policies: a decision reaches it
as a ``Chooser`` callback.
"""

from router.state.base import Booking, Chooser, Load, Snapshot, StateStore
from router.state.memory import MemoryStore

__all__ = ["Booking", "Chooser", "Load", "MemoryStore", "Snapshot", "StateStore"]
