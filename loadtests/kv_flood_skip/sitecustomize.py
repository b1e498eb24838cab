"""``kv_flood.py --skip-set-updates``: the router's mirror tables take each sidecar delta's
state (size, overflow, freshness) but leave their key sets alone.

A measuring instrument, not a mode of the router: run against the normal benchmark, it
splits what a flood adds to the router's CPU into the set updates themselves and
everything else (reading and framing the deltas, wake-ups, the other core's traffic).
Python imports ``sitecustomize`` at start-up from the first directory of ``sys.path``
that has one; ``kv_flood.py`` puts this directory first on the PYTHONPATH of the
processes it starts and sets ``KV_FLOOD_SKIP_SET_UPDATES=1``.
"""

from __future__ import annotations

import os

if os.environ.get("KV_FLOOD_SKIP_SET_UPDATES") == "1":
    from router.state import precise_mirror

    def _state_only(self: precise_mirror.MirrorTable, delta: precise_mirror.TableDelta, done: int,
                    budget: int) -> int:
        total = precise_mirror.delta_changes(delta)
        end = min(total, done + budget)
        if end >= total:
            self._size = delta.size
            self.overflow = delta.overflow
            self.fresh = delta.fresh
        return end

    precise_mirror.MirrorTable.apply_part = _state_only  # type: ignore[method-assign]
