"""Trace parsers, synthetic generators and prompt expansion."""

import itertools
import json

import pytest

from router.config.model import HashingConfig
from router.request.hashing import root_seed, token_block_keys
from router.tools.replay.prompts import PromptBuilder
from router.tools.replay.synthetic import BLOCK_TOKENS, generate
from router.tools.replay.source import load_trace
from router.tools.replay.trace import TraceError, TraceRequest, read_azure, read_mooncake


def mooncake(tmp_path, *records, raw=()):
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(r) for r in records] + list(raw)
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = [
    {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]},
    {"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [0]},
]


def test_mooncake_good_lines_parse(tmp_path):
    trace = read_mooncake(mooncake(tmp_path, *GOOD))
    assert trace.block_tokens == 512 and trace.reordered == 0
    assert trace.requests == (
        TraceRequest(0.0, 1000, 10, (0, 1)),
        TraceRequest(1.5, 600, 5, (0, 2)),
        TraceRequest(1.5, 512, 1, (0,)),
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [0]}', "missing field 'timestamp'"),
        ('{"timestamp": 1, "output_length": 1, "hash_ids": [0]}', "missing field 'input_length'"),
        ('{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": []}', "input_length must be >= 1, got -5"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 0, "hash_ids": [0]}', "output_length must be >= 1"),
        ('{"timestamp": 1, "input_length": "10", "output_length": 1, "hash_ids": [0]}', "input_length must be an integer"),
        ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}', "timestamp must be a non-negative"),
        ('{"timestamp": 1, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1]}', "2 hash_ids for input_length 1100; expected 3"),
        ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [-3]}', "hash_ids must be a list of non-negative"),
        ('{"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [1, 0]}', "contradicts line 1"),
    ],
)
def test_mooncake_bad_line_names_file_line_and_problem(tmp_path, line, message):
    path = mooncake(tmp_path, GOOD[0], raw=[line])
    with pytest.raises(TraceError) as err:
        read_mooncake(path)
    assert f"{path}:2:" in str(err.value) and message in str(err.value)


def test_mooncake_out_of_order_timestamps_are_sorted_and_counted(tmp_path):
    late, early = dict(GOOD[1], timestamp=5000), dict(GOOD[2], timestamp=2000)
    trace = read_mooncake(mooncake(tmp_path, GOOD[0], late, early))
    assert [r.arrival_s for r in trace.requests] == [0.0, 2.0, 5.0]
    assert trace.reordered == 1


def test_mooncake_first_arrival_moves_to_zero_and_scaling_divides(tmp_path):
    trace = read_mooncake(mooncake(tmp_path, dict(GOOD[0], timestamp=1000), dict(GOOD[1], timestamp=3000)))
    assert [r.arrival_s for r in trace.scaled(4).requests] == [0.0, 0.5]
    assert len(trace.limited(1).requests) == 1


def test_missing_and_empty_files_are_clear(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        read_mooncake(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        read_mooncake(tmp_path / "empty.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(json.dumps(GOOD[0]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError, match=r"bin.jsonl:2: not UTF-8"):
        read_mooncake(tmp_path / "bin.jsonl")


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:05.4799600,100,3"


def test_azure_parses_seven_digit_fractions_and_a_missing_final_newline(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(AZURE)
    trace = read_azure(path)
    assert [(r.input_tokens, r.output_tokens) for r in trace.requests] == [(4808, 10), (100, 3)]
    assert trace.requests[1].arrival_s == pytest.approx(1.5, abs=1e-6)
    # no prefix information: the two prompts share no block
    assert not set(trace.requests[0].blocks) & set(trace.requests[1].blocks)
    assert len(trace.requests[0].blocks) == 10


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:17:xx.1,10,1", "bad TIMESTAMP"),
        ("2023-13-16 18:17:03.1,10,1", "bad TIMESTAMP"),
        ("2023-11-16 18:17:03.1,ten,1", "ContextTokens must be an integer"),
        ("2023-11-16 18:17:03.1,10,0", "GeneratedTokens must be >= 1"),
        ("2023-11-16 18:17:03.1,10", "expected 3 comma-separated fields"),
    ],
)
def test_azure_bad_rows(tmp_path, row, message):
    path = tmp_path / "a.csv"
    path.write_text(AZURE + "\n" + row + "\n")
    with pytest.raises(TraceError) as err:
        read_azure(path)
    assert f"{path}:4:" in str(err.value) and message in str(err.value)


def test_azure_needs_its_header(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("time,in,out\n2023-11-16 18:17:03.1,10,1\n")
    with pytest.raises(TraceError, match=r"a.csv:1: expected the header"):
        read_azure(path)


def test_load_trace_dispatches_on_kind(tmp_path):
    with pytest.raises(TraceError, match="unknown trace kind"):
        load_trace(str(tmp_path / "x.txt"))
    assert load_trace("synthetic:dispersed:requests=5").name.startswith("synthetic:dispersed")


# -- synthetic -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["shared_prefix:groups=4,stages=5x10", "multi_turn:sessions=10", "dispersed:requests=50"])
def test_synthetic_is_deterministic_per_seed(spec):
    a, b, c = generate(spec, 1), generate(spec, 1), generate(spec, 2)
    assert a == b and a.requests != c.requests
    times = [r.arrival_s for r in a.requests]
    assert times == sorted(times) and times[0] == 0.0
    for r in a.requests:
        assert len(r.blocks) == -(-r.input_tokens // BLOCK_TOKENS)


def test_shared_prefix_shares_the_system_prompt_within_a_group_only():
    trace = generate("shared_prefix:groups=3,users=2,system=640,question=128,stages=20x5", 0)
    heads = {r.blocks[:10] for r in trace.requests}
    assert len(heads) == 3  # one 10-block system prompt per group
    assert len({r.blocks for r in trace.requests}) <= 6  # 3 groups x 2 fixed questions


def test_multi_turn_prompts_extend_the_previous_turn():
    trace = generate("multi_turn:sessions=1,turns=4,system=128", 0)
    reqs = trace.requests
    for prev, nxt in itertools.pairwise(reqs):
        assert nxt.input_tokens > prev.input_tokens + prev.output_tokens - 1
        full = prev.input_tokens // BLOCK_TOKENS
        assert nxt.blocks[:full] == prev.blocks[:full]


def test_dispersed_reuses_little():
    trace = generate("dispersed:requests=400,reuse=0.05", 3)
    firsts = [r.blocks[0] for r in trace.requests]
    repeats = len(firsts) - len(set(firsts))
    assert 0 < repeats < 0.12 * len(firsts)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown synthetic workload 'nope'"),
        ("dispersed:bogus=1", "bad parameter 'bogus=1'"),
        ("dispersed:requests=many", "requests must be int"),
        ("dispersed:rate=0", "rate must be > 0"),
        ("shared_prefix:stages=5y10", "bad stage '5y10'"),
    ],
)
def test_synthetic_spec_errors(spec, message):
    with pytest.raises(TraceError, match=message):
        generate(spec)


# -- prompts ---------------------------------------------------------------------------------

def test_equal_ids_give_equal_tokens_and_the_router_keys_of_the_whole_prompt():
    builder = PromptBuilder(512, HashingConfig(), "m")
    a = TraceRequest(0, 1100, 1, (7, 8, 9))
    b = TraceRequest(0, 700, 1, (7, 5))
    ta, tb = builder.tokens(a), builder.tokens(b)
    assert len(ta) == 1100 and len(tb) == 700
    assert ta[:512] == tb[:512] and ta[512:700] != tb[512:700]
    for req, toks in ((a, ta), (b, tb), (a, ta)):  # the third call hits the per-id cache
        assert builder.keys(req, toks) == tuple(token_block_keys(toks, 64, root_seed("m"), 4096))


def test_unaligned_trace_blocks_still_give_exact_keys():
    builder = PromptBuilder(100, HashingConfig(), "m")
    req = TraceRequest(0, 250, 1, (1, 2, 3))
    toks = builder.tokens(req)
    assert builder.keys(req, toks) == tuple(token_block_keys(toks, 64, root_seed("m"), 4096))
