"""Summarise py-spy collapsed stacks (``--format raw``) into the few lines that matter.

Why: a flame graph needs a browser; for a report we want "which functions hold the CPU"
as text. Two views: *self* time (the leaf frame: where the CPU actually is) and *inclusive*
time (any frame on the stack: which call is expensive, all callees included), both as a share
of all samples, each function counted once per sample.

    python loadtests/profile_summary.py /tmp/pd-router-profile.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _label(frame: str) -> str:
    """``func (path/to/site-packages/pkg/mod.py:12)`` -> ``pkg/mod.py:func``."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/router/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/router/":
                path = "router/" + path
            break
    return f"{path}:{m.group('func')}"


# Leaf frames of threads parked in a blocking call py-spy does not see as idle (the loop's
# default executor, waiting on its queue): not CPU, and a third of all samples of a quiet pool.
_IDLE_LEAVES = ("concurrent/futures/thread.py:_worker",)


def parse(text: str) -> tuple[Counter[str], Counter[str], int]:
    """(self counts, inclusive counts, total samples) from collapsed-stack lines, idle
    executor threads left out (``idle_samples`` counts them)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_label(f) for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames or frames[-1] in _IDLE_LEAVES:
            continue
        total += n
        own[frames[-1]] += n
        for label in set(frames):
            inclusive[label] += n
    return own, inclusive, total


def idle_samples(text: str) -> int:
    """Samples of threads parked in the executor (left out of :func:`parse`)."""
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit() and _label(stack.split(";")[-1]) in _IDLE_LEAVES:
            total += int(count)
    return total


def summarise(text: str, top: int = 15) -> str:
    """Two ranked lists as text: self time and inclusive time, in % of samples. Frames on nearly
    every stack (the event loop, the server, the ASGI middleware) say nothing and are left out."""
    own, inclusive, total = parse(text)
    if not total:
        return "no samples"
    lines = [f"{total} samples (+{idle_samples(text)} of idle executor threads, left out)", "", "self time (where the CPU is):"]
    lines += [f"  {100 * n / total:5.1f}%  {label}" for label, n in own.most_common(top)]
    lines += ["", "inclusive time (callees included), frames on < 80% of samples:"]
    telling = [(label, n) for label, n in inclusive.most_common() if n < 0.8 * total]
    lines += [f"  {100 * n / total:5.1f}%  {label}" for label, n in telling[: top * 2]]
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(summarise(fh.read(), int(sys.argv[2]) if len(sys.argv) > 2 else 15))
