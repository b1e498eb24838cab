"""``python -m router.emulator ...`` (same flags as ``pd-router emulate``)."""

from router.emulator.cli import main

raise SystemExit(main())
