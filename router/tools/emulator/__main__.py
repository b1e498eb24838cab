"""``python -m router.tools.emulator ...`` (same flags as ``pd-router emulate``)."""

from router.tools.emulator.cli import main

raise SystemExit(main())
