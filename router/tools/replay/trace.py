"""Request traces: the Mooncake and Azure file formats, parsed strictly, in one shape.

Every trace becomes a list of ``TraceRequest``: arrival time, lengths, and the prompt as
content block ids of ``block_tokens`` tokens each (the last block may be partial). Ids
carry Mooncake's prefix semantics: two prompts with the same id at position i share their
first (i+1) * block_tokens tokens. Formats without prefix information (Azure) get fresh
ids, i.e. prompts that share nothing.

Bad input fails loudly with ``path:line: what is wrong``: a replay of a half-parsed trace
would produce plausible but wrong figures. Arrival times that go backwards are allowed:
the requests are stably sorted by arrival (file order is not meaningful once a trace is
merged from several sources) and the number of such lines is reported in
``Trace.reordered``, so it stays visible.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]  # content id of each block_tokens-token block of the prompt


@dataclass(frozen=True)
class Trace:
    name: str
    block_tokens: int
    requests: tuple[TraceRequest, ...]  # sorted by arrival, first at 0
    reordered: int = 0  # lines whose timestamp was earlier than the line before

    def scaled(self, rate_scale: float) -> Trace:
        """Arrival rate x ``rate_scale`` (timestamps / rate_scale)."""
        if rate_scale <= 0:
            raise ValueError("rate scale must be > 0")
        if rate_scale == 1:
            return self
        reqs = tuple(replace(r, arrival_s=r.arrival_s / rate_scale) for r in self.requests)
        return replace(self, requests=reqs)

    def limited(self, limit: int | None) -> Trace:
        """The first ``limit`` arrivals."""
        if limit is None or limit >= len(self.requests):
            return self
        return replace(self, requests=self.requests[:limit])


def finish(name: str, block_tokens: int, requests: list[TraceRequest]) -> Trace:
    """Sort by arrival (stable), shift the first arrival to 0, count lines out of order."""
    reordered = sum(1 for a, b in itertools.pairwise(requests) if b.arrival_s < a.arrival_s)
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    start = ordered[0].arrival_s if ordered else 0.0
    if start:
        ordered = [replace(r, arrival_s=r.arrival_s - start) for r in ordered]
    return Trace(name, block_tokens, tuple(ordered), reordered)


def _int_field(record: dict, key: str, where: str, minimum: int) -> int:
    if key not in record:
        raise TraceError(f"{where}: missing field {key!r}")
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: {key} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(f"{where}: {key} must be >= {minimum}, got {value}")
    return value


class _PrefixChecker:
    """Checks Mooncake's invariant: an id always sits at the same position after the same
    parent. The replay derives tokens and keys from ids, so a violation would silently
    fake cache hits."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, int | None, int]] = {}  # id -> (position, parent, line)

    def check(self, ids: list[int], where: str, lineno: int) -> None:
        parent: int | None = None
        for pos, block in enumerate(ids):
            first = self._seen.setdefault(block, (pos, parent, lineno))
            if first[:2] != (pos, parent):
                raise TraceError(
                    f"{where}: hash id {block} at position {pos} after {parent} contradicts line {first[2]}"
                    f" (position {first[0]} after {first[1]}); equal ids must mean equal prefixes"
                )
            parent = block


def read_mooncake(path: str | Path) -> Trace:
    """``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`` per line."""
    path = Path(path)
    requests: list[TraceRequest] = []
    checker = _PrefixChecker()
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if "timestamp" not in record:
            raise TraceError(f"{where}: missing field 'timestamp'")
        ts = record["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise TraceError(f"{where}: timestamp must be a non-negative number of milliseconds, got {ts!r}")
        n_in = _int_field(record, "input_length", where, 1)
        n_out = _int_field(record, "output_length", where, 1)
        ids = record.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
        expected = -(-n_in // MOONCAKE_BLOCK_TOKENS)
        if len(ids) != expected:
            raise TraceError(
                f"{where}: {len(ids)} hash_ids for input_length {n_in}; expected {expected}"
                f" (one per {MOONCAKE_BLOCK_TOKENS}-token block)"
            )
        checker.check(ids, where, lineno)
        requests.append(TraceRequest(ts / 1000.0, n_in, n_out, tuple(ids)))
    if not requests:
        raise TraceError(f"{path}: no requests")
    return finish(path.name, MOONCAKE_BLOCK_TOKENS, requests)


def _azure_time(text: str, where: str) -> float:
    """Seconds since the epoch (naive, the file's own clock) of ``YYYY-MM-DD HH:MM:SS.fffffff``."""
    head, _, frac = text.strip().partition(".")
    try:
        base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
        if frac and not frac.isdigit():
            raise ValueError
    except ValueError:
        raise TraceError(f"{where}: bad TIMESTAMP {text!r}; expected YYYY-MM-DD HH:MM:SS[.fraction]") from None
    seconds = (base - datetime(1970, 1, 1)).total_seconds()
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


def read_azure(path: str | Path) -> Trace:
    """``TIMESTAMP,ContextTokens,GeneratedTokens``: lengths only, so every prompt is unique."""
    path = Path(path)
    requests: list[TraceRequest] = []
    next_id = 0
    for lineno, line in _lines(path):
        where = f"{path}:{lineno}"
        fields = [f.strip() for f in line.strip().lstrip("\ufeff").split(",")]
        if lineno == 1:
            if tuple(fields) != AZURE_HEADER:
                raise TraceError(f"{where}: expected the header {','.join(AZURE_HEADER)}, got {line.strip()!r}")
            continue
        if fields == [""]:
            continue
        if len(fields) != 3:
            raise TraceError(f"{where}: expected 3 comma-separated fields, got {len(fields)}")
        arrival = _azure_time(fields[0], where)
        lengths = []
        for name, raw in zip(AZURE_HEADER[1:], fields[1:]):
            try:
                value = int(raw)
            except ValueError:
                raise TraceError(f"{where}: {name} must be an integer, got {raw!r}") from None
            if value < 1:
                raise TraceError(f"{where}: {name} must be >= 1, got {value}")
            lengths.append(value)
        n_blocks = -(-lengths[0] // MOONCAKE_BLOCK_TOKENS)
        requests.append(TraceRequest(arrival, lengths[0], lengths[1], tuple(range(next_id, next_id + n_blocks))))
        next_id += n_blocks
    if not requests:
        raise TraceError(f"{path}: no requests")
    return finish(path.name, MOONCAKE_BLOCK_TOKENS, requests)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line; undecodable bytes name their line."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceError(f"{path}:{lineno}: not UTF-8 text") from None
