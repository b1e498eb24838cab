"""The router <-> sidecar byte stream: deltas round-trip, frames split anywhere."""

import random
from array import array

import pytest

from router.kvevents.sidecar_wire import (
    DELTA, STATS, ChannelError, FrameReader, decode_delta, encode_delta, frame, json_frame,
)
from router.state.precise_mirror import TableDelta


def test_a_delta_round_trips_with_uint64_keys():
    delta = TableDelta(True, 12, 3, True, array("Q", [1, 2**64 - 1]), array("Q", [5]), array("Q"), array("Q", [7, 8, 9]))
    data = encode_delta("prefill-é", 2, delta, gen=2**32 - 1)
    ((kind, body),) = FrameReader().feed(data)
    assert kind == DELTA
    assert decode_delta(body) == ("prefill-é", 2, 2**32 - 1, delta)


def test_frames_are_reassembled_from_any_split():
    frames = [encode_delta("a", 0, TableDelta(False, i, 0, False, array("Q", range(i)))) for i in range(20)]
    frames.append(json_frame(STATS, {"sources": {}, "receive_errors": 0}))
    stream = b"".join(frames)
    rng = random.Random(1)
    reader, got, pos = FrameReader(), [], 0
    while pos < len(stream):
        step = rng.randrange(1, 40)
        got.extend(reader.feed(stream[pos:pos + step]))
        pos += step
    assert [k for k, _ in got] == [DELTA] * 20 + [STATS]
    assert [decode_delta(b).delta.size for _, b in got[:20]] == list(range(20))


def test_a_delta_whose_arrays_do_not_fill_it_is_refused():
    (_, body), = FrameReader().feed(encode_delta("a", 0, TableDelta(True, 1, 0)))
    with pytest.raises(ChannelError):
        decode_delta(body + b"\0" * 8)


def test_an_absurd_frame_length_is_refused():
    with pytest.raises(ChannelError):
        FrameReader().feed(frame(DELTA, b"")[:0] + (1 << 30).to_bytes(4, "little") + DELTA)
