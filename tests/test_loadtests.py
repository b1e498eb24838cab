"""Smoke tests for the benchmark scripts under loadtests/ (no peer routers needed, a few seconds).

Why only smoke: the benchmarks themselves take minutes and need the peers; these catch a
script that no longer parses its arguments, renders its tables or talks to the zero backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # loadtests/ is not an installed package

from loadtests import kv_events_bench, overhead, peers, side_by_side
from loadtests.loadgen import LoadResult, encode_post, run_load
from loadtests.machine import Busy, contention_note
from loadtests.profile_summary import summarise


def test_arguments_have_working_defaults() -> None:
    o = overhead.parse_args([])
    assert o.concurrency == [1, 16, 64] and o.peers == ["sglang-router", "vllm-router"] and not o.write
    s = side_by_side.parse_args(["--scenarios", "colocated", "--duration", "5"])
    assert s.scenarios == ["colocated"] and s.duration == 5 and s.time_scale == 1.0
    env = side_by_side.locust_env(s)
    assert env["PDR_LT_GROUPS"] == "12" and env["PDR_LT_MODEL"] == "demo-model"


def test_peer_command_lines_bind_loopback_and_own_prometheus_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "_binary", lambda name: "/opt/bench/" + name)  # peers are a bench extra, not installed in CI
    regular = peers.Workers(regular=("http://127.0.0.1:1", "http://127.0.0.1:2"))
    argv = peers.peer_argv("sglang-router", regular, 30000, 29001)
    assert argv[1:2] == ["launch"] and ["--host", "127.0.0.1"] == argv[argv.index("--host"):argv.index("--host") + 2]
    assert "--prometheus-port" in argv and "29001" in argv and "--pd-disaggregation" not in argv
    pd = peers.Workers(prefill=(("http://127.0.0.1:3", 9100), ("http://127.0.0.1:4", None)), decode=("http://127.0.0.1:5",))
    argv = peers.peer_argv("vllm-router", pd, 30001, 29002)
    assert "--vllm-pd-disaggregation" in argv and "--worker-startup-check-interval" in argv
    assert argv[argv.index("--prefill") + 2] == "9100" and "none" in argv and pd.count == 3
    monkeypatch.setattr(peers, "_module", lambda name: ["/opt/bench/python", "-m", name])
    argv = peers.peer_argv("smg", regular, 30002, 29003)  # smg 1.13 through its own package, not a bin/smg
    assert argv[1:4] == ["-m", "smg", "launch"] and "--worker-urls" in argv
    assert peers.peer_argv("sglang-router", regular, 30000, 29001)[0].endswith("/sglang-router")
    with pytest.raises(ValueError):
        peers.peer_argv("nginx", regular, 1, 2)


def test_a_peer_that_cannot_start_is_reported_not_raised_raw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "_binary", lambda name: "/nonexistent/" + name)
    with pytest.raises(peers.PeerUnavailable, match="cannot start"), \
            peers.peer_router("sglang-router", peers.Workers(regular=("http://127.0.0.1:1",))):
        pass


def test_side_by_side_reads_locust_csv_and_renders(tmp_path: Path) -> None:
    prefix = str(tmp_path / "run")
    header = "Type,Name,Request Count,Failure Count,50%,90%\n"
    Path(prefix + "_stats.csv").write_text(header + "POST,/v1/completions,100,2,900,1200\nSSE,ttft,98,0,40,75\n"
                                           ",Aggregated,198,2,100,900\n")
    row = side_by_side.Row("colocated", "pd-router")
    side_by_side.read_locust(prefix, "x shared-prefix load: 98 ok streams, 3136 output tokens, 104.5 output tokens/s", row)
    assert (row.requests, row.errors, row.ttft_p50_ms, row.ttft_p90_ms, row.tokens_per_s) == (100, 2, 40.0, 75.0, 104.5)
    before = {"m0": {"tokens": {"cached": 0, "prefill_computed": 0}}}
    side_by_side.engine_delta(before, {"m0": {"tokens": {"cached": 900, "prefill_computed": 100}}}, row)
    assert math.isclose(row.hit_ratio, 0.9) and math.isclose(row.computed_k, 0.1)
    text = side_by_side.render([row, side_by_side.Row("pd-vllm", "vllm-router", note="did not start: x")])
    assert "| colocated | pd-router | 104 | 40 | 75 | 100 | 2 | 90% |" in text and "| — |" in text and "did not start" in text


def test_overhead_table_compares_with_sglang_router() -> None:
    def res(ms: float, rps: float) -> LoadResult:
        return LoadResult(latencies=[ms / 1000] * 10, completed=int(rps), window_s=1.0)

    results = {("direct", 1): res(0.1, 5000), ("pd-router", 1): res(0.3, 2000), ("sglang-router", 1): res(0.2, 3000)}
    text = overhead.render(results, ["direct", "pd-router", "sglang-router"], [1])
    assert "| 1 | pd-router | 0.30 | 0.30 | +0.20 | +0.20 | 2000 | 0 |" in text
    assert "| pd-router | c=1 | 0.20 vs 0.10 ms | 2.00× | no |" in text and "| 67% | no |" in text


def test_profile_summary_ranks_self_and_inclusive_time() -> None:
    stacks = ("process 1;main (app.py:1);handle (router/service.py:10);send (httpx/_client.py:5) 3\n"
              "process 1;main (app.py:1);handle (router/service.py:10) 1\n")
    text = summarise(stacks)
    assert text.startswith("4 samples") and "75.0%  httpx/_client.py:send" in text and "100.0%  app.py:main" not in text


def test_contention_note() -> None:
    assert "No other heavy process" in contention_note([])
    assert "under contention" in contention_note([Busy(1, 97.0, "pd-router replay trace.jsonl")])


def test_loadgen_against_the_zero_backend() -> None:
    with overhead.zero_backend(1) as (urls, _pid):
        host, port = urls[0].rsplit("//", 1)[1].split(":")
        reqs = [encode_post(host, int(port), "/v1/completions", b) for b in overhead.request_bodies()[:4]]
        result = asyncio.run(run_load(host, int(port), reqs, concurrency=2, duration_s=0.3, warmup_s=0.1))
    assert result.errors == 0 and result.completed > 10 and result.percentile(0.5) < 0.05


def test_overhead_end_to_end_without_peers(capsys: pytest.CaptureFixture[str]) -> None:
    assert overhead.main(["--peers", "--concurrency", "2", "--duration", "0.3", "--warmup", "0.1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | direct |" in out and "| 2 | pd-router |" in out and "sglang" not in out


def test_real_vllm_prediction_traffic_is_b2b_and_deterministic() -> None:
    import argparse

    from loadtests import real_vllm_prediction as rv

    args = argparse.Namespace(tenants=4, requests=30, system_chars=900, question_chars=100, max_tokens=4, seed=3)
    first, again = rv.bodies(args), rv.bodies(args)
    assert first == again and len(first) == 30
    systems = {b["messages"][0]["content"] for b in first}
    assert 1 < len(systems) <= 4 and all(len(s) == 900 + len("Tenant 0 handbook. ") for s in systems)
    assert all(b["model"] == "tiny" and b["stream_options"] == {"include_usage": True} for b in first)
    assert len({b["messages"][1]["content"] for b in first}) == 30  # every question differs


def test_real_vllm_prediction_setups_are_valid_router_configs(tmp_path) -> None:
    from loadtests import real_vllm_prediction as rv
    from router.config.model import load_config

    (tmp_path / "tokenizer.json").write_text("{}")
    for name, setup in rv.SETUPS.items():
        config = load_config(overrides={"instances": [{"url": "http://127.0.0.1:9", "name": "vllm0"}],
                                        "server": {"admin_token": rv.ADMIN}, **setup(tmp_path)})
        assert config.kv_events.enabled == name.startswith("precise")
        assert (config.hashing.mode == "tokens") == ("tokens" in name or name.startswith("precise"))
    assert set(rv.DEFAULT_SETUPS) <= set(rv.SETUPS)


def test_zero_backend_streams_when_asked() -> None:
    import httpx

    with overhead.zero_backend(1) as (urls, _pid):
        body = {"model": "zero-model", "prompt": "hi", "max_tokens": 4, "stream": True}
        with httpx.Client(trust_env=False) as client:
            r = client.post(f"{urls[0]}/v1/completions", json=body)
            plain = client.post(f"{urls[0]}/v1/completions", json={**body, "stream": False})
    assert r.headers["content-type"] == "text/event-stream" and r.text.endswith("data: [DONE]\n\n")
    assert plain.json()["object"] == "text_completion"


def test_cpu_per_request_end_to_end_without_peers(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from loadtests import cpu_per_request

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores")
    affinity = os.sched_getaffinity(0)
    try:
        assert cpu_per_request.main(["--peers", "--no-redis", "--floor", "--concurrency", "2", "--duration", "0.3",
                                     "--warmup", "0.1", "--rounds", "1"]) == 0
    finally:
        os.sched_setaffinity(0, affinity)  # the script pins its own process to the load core
    out = capsys.readouterr().out
    assert "| plain | 2 | pd-router |" in out and "| stream | 2 | pd-router |" in out
    assert "| plain | 2 | python floor |" in out and "| stream | 2 | python floor |" in out  # relays both, no errors
    assert all(line.rstrip().endswith("| 0 |") for line in out.splitlines() if line.startswith("| plain") or line.startswith("| stream"))


def test_kv_events_bench_replay_part_renders_both_residencies() -> None:
    args = kv_events_bench.parse_args(["--trace", "synthetic:shared_prefix:groups=4,users=2,system=600,question=100,"
                                       "output=8,stages=2x10", "--replay-cache-tokens", "2000"])
    assert args.parts == ["replay", "live", "tokenize"] and not args.write
    text = kv_events_bench.part_replay(args)
    assert text.count("| approximate |") == 2 and text.count("| precise |") == 2


def test_matrix_cells_are_drawn_from_the_seed_and_selected_by_pattern() -> None:
    from loadtests.matrix_cells import Cell, all_cells, draw, select

    assert len(all_cells()) == 36
    assert {c.name for c in select(["chat/2x"])} == {"chat/2x/defaults", "chat/2x/facts"}
    assert {c.name for c in select(["b2b_zipf/8x/facts", "longdoc"])} >= {"b2b_zipf/8x/facts", "longdoc/0.5x/facts"}
    cell = Cell("b2b_zipf", 2.0, "facts")
    a, b, other = draw(cell, 1, 60), draw(cell, 1, 60), draw(cell, 2, 60)
    assert a == b and (a.spec != other.spec or a.trace != other.trace)
    assert a.spec.told and not draw(Cell("b2b_zipf", 2.0, "defaults"), 1, 60).spec.told
    assert all(r.input_tokens <= len(r.blocks) * 128 for r in a.trace.requests)
    low, high = draw(Cell("chat", 0.5, "facts"), 1, 80), draw(Cell("chat", 8.0, "facts"), 1, 80)
    assert low.hot_tokens / (4 * low.spec.cache_tokens) < high.hot_tokens / (4 * high.spec.cache_tokens)


def test_matrix_live_prompts_share_the_trace_prefixes() -> None:
    from loadtests.matrix_live import prompt_text
    from router.tools.emulator.tokenizer import Tokenizer
    from router.tools.replay.trace import TraceRequest

    a, b = TraceRequest(0.0, 200, 4, (1, 2)), TraceRequest(0.0, 150, 4, (1, 3))
    ta, tb = prompt_text(a), prompt_text(b)
    assert ta[:128 * 4] == tb[:128 * 4] and ta[128 * 4:] != tb[128 * 4:]
    assert abs(len(Tokenizer().encode(ta, add_bos=False)) - 200) <= 2  # about one token per word


def test_quality_matrix_replays_a_cell_and_reports_a_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests import quality_matrix

    assert quality_matrix.main(["--cells", "dispersed/0.5x/facts", "--no-live", "--requests", "40"]) == 0
    out = capsys.readouterr().out
    assert "| dispersed/0.5x/facts | replay |" in out and "| dispersed/0.5x/facts | bound |" in out
    assert "| dispersed/0.5x/facts | lru_alone |" in out
    assert quality_matrix.main(["--cells", "nothing", "--no-live"]) == 2
    assert quality_matrix.verdict(0.5, 0.7, {"a": (1.0, 0.71)}) == "meets target"
    assert quality_matrix.verdict(0.9, 0.6, {"a": (1.0, 0.7)}) == "misses: p90 0.90x best peer, hit -10 pts"


def test_quality_seeds_reports_both_references_and_reads_runs_from_before_lru(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests import quality_seeds

    out = tmp_path / "run.json"
    assert quality_seeds.main(["--seeds", "1", "--cells", "dispersed/0.5x/facts", "--requests", "40", "--jobs", "1",
                               "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["bound_p90"] <= row["lru_p90"] < math.inf
    assert "lru_alone p90 / cache_aware's" in capsys.readouterr().out
    del row["lru_p90"]  # a run written before the column existed
    old = tmp_path / "old.json"
    old.write_text(json.dumps([row]))
    assert quality_seeds.main(["--results", str(old)]) == 0
    assert "| dispersed/0.5x/facts |" in capsys.readouterr().out


def test_cache_reach_counts_what_each_cache_keeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests import cache_reach
    from router.tools.replay.trace import Trace, TraceRequest

    a, b, c = (1, 2), (3, 4), (5, 6)  # 1,024-token prompts, two 512-token blocks each
    order = [a, b, a, c, a, b]
    trace = Trace("t", 512, tuple(TraceRequest(float(i), 1024, 4, blocks) for i, blocks in enumerate(order)))
    r = cache_reach.reach(trace, 4 * 512)  # room for two prompts
    assert r.infinite == pytest.approx(0.5)  # a, a, b again
    assert r.lru == pytest.approx(1 / 3)  # c evicts b, so b's return misses
    assert r.belady == pytest.approx(0.5)  # keeps a and b, lets c go at once
    assert r.followup_gap_s == (2.0, 4.0, 4.0) and r.hold_s == pytest.approx(2048 / (6144 / 5))
    assert cache_reach.reach(trace, 1 << 30).lru == pytest.approx(r.infinite)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 1024, "output_length": 4,
                                        "hash_ids": [10 * i + 1, 10 * i + 2] if i != 2 else [1, 2]}) + "\n"
                            for i in range(3)))
    assert cache_reach.main([str(path), "--engines", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["hit_infinite"] == pytest.approx(1 / 3, abs=1e-4)
    assert cache_reach.main([str(tmp_path / "missing.jsonl")]) == 2


def test_decision_cost_measures_the_redis_store_in_one_round_trip(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests import decision_cost

    args = argparse.Namespace(redis=redis_url, instances=[40], tokens=[1024], iterations=5, pd=False, candidates=[0, 4],
                              write=False, phases=True)
    assert asyncio.run(decision_cost.main(args)) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| redis |")]
    assert len(rows) == 2 and all(row.rstrip(" |").endswith("| 1") for row in rows)  # one round trip per decision
    phases = [line for line in out.splitlines() if line.startswith(("| off | 40 | 1024 |", "| 4 | 40 | 1024 |"))]
    assert len(phases) == 2 and all(len(line.strip(" |").split(" | ")) == 9 for line in phases)  # every phase timed


def test_decision_cost_side_by_side_runs_both_trees(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests import decision_cost

    argv = ["--redis", redis_url, "--instances", "20", "--tokens", "1024", "--iterations", "5", "--candidates", "4",
            "--baseline", "HEAD", "--rounds", "2"]
    args = argparse.Namespace(redis=redis_url, baseline="HEAD", rounds=2, write=False)
    assert decision_cost.side_by_side(args, argv) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| redis | 20 × 1K |")]
    assert len(rows) == 1 and rows[0].rstrip(" |").endswith("| 1 → 1"), out  # one round trip per decision in both trees
    assert out.count(" done (load ") == 4  # two rounds of each tree


def test_scale_out_end_to_end_with_one_replica(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests import scale_out

    assert scale_out.main(["--replicas", "1", "--engines", "2", "--requests", "24", "--clients", "4",
                           "--concurrency", "4", "--duration", "1", "--warmup", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 0." in out and "Projection to N = 32" in out
    for line in out.splitlines():
        if line.startswith("| 1 |"):
            assert line.rstrip(" |").endswith("| 0")  # no booked load left in Redis


def test_scale_out_projection_names_the_bound() -> None:
    from loadtests.scale_out import Throughput, projection

    alone = Throughput(2, "standalone", 900.0, router_cpu_us=1000.0, redis_cpu_us=250.0, errors=0, phantom=0)
    text = projection([alone])
    assert "32,000 req/s of router capacity" in text
    assert "4,000 req/s → N = 32 serves 4,000 req/s (Redis-bound)" in text
    cluster = Throughput(2, "Cluster (3 primaries)", 900.0, router_cpu_us=1000.0, redis_cpu_us=400.0, errors=0, phantom=0)
    text = projection([alone, cluster])
    assert "16 primaries: Redis saturates at 32,000 req/s" in text and "3 primaries: Redis saturates at 6,000 req/s" in text


def test_kv_flood_payloads_apply_in_steady_state() -> None:
    """The flood stores fresh blocks and removes ones stored LAG messages before: the table
    stays at a steady size, no removal misses, and the typed path decodes every message."""
    from loadtests.kv_flood import BLOCKS_PER_EVENT, LAG, PER_MESSAGE, POOL, flood_payloads
    from router.kvevents.apply import TableWriter
    from router.kvevents.wire import StoredMap, decode_batch
    from router.state.precise import BlockTable

    writer = TableWriter(BlockTable(1_000_000), "m", 16)
    payloads = flood_payloads()
    assert len(payloads) == POOL
    for payload in payloads + payloads[:LAG]:
        events = decode_batch(payload)[1]
        assert isinstance(events[0], StoredMap)
        writer.apply_raw(events)
    assert len(writer.table) == LAG * PER_MESSAGE // 2 * BLOCKS_PER_EVENT
    assert writer.counters.refused == writer.counters.orphans == 0


def test_engine_calibration_bench_gives_the_router_only_urls_and_the_wrong_rate() -> None:
    from types import SimpleNamespace

    from loadtests import engine_calibration
    from router.config.model import load_config

    args = engine_calibration.parse_args([])
    assert (args.seconds, args.bypass, args.wrong, args.cell) == (60.0, 0.5, 2.5, "b2b_uniform/2/defaults")
    engines = [SimpleNamespace(url=f"http://127.0.0.1:{9000 + i}", name=f"e{i}") for i in range(2)]
    for on in (False, True):
        config = load_config(overrides=engine_calibration.config(engines, 1234.0, on, 1))  # type: ignore[arg-type]
        assert config.policy.ttft.prefill_tokens_per_s == 1234.0 and config.engines.calibration.enabled is on
        assert all(i.prefill_tokens_per_s is None for i in config.instances)  # the default rate decides


def test_sidecar_cost_measures_either_table_kind_and_refuses_a_pass_it_cannot_warm() -> None:
    from loadtests.kv_flood import MAX_MEASURED, sidecar_cost

    assert sidecar_cost(True, repeats=1, messages=16) > 0
    assert sidecar_cost(False, repeats=1, messages=16) > 0
    assert sidecar_cost(True, repeats=1, messages=0) == 0.0  # the callgrind baseline: applies nothing
    with pytest.raises(ValueError):
        sidecar_cost(True, messages=MAX_MEASURED + 1)


def test_kv_ingest_cost_applies_a_small_flood_and_measures_both_sides() -> None:
    """A real sidecar and publisher: every event of a flood the sidecar easily keeps up with
    is applied, and both CPU figures are there."""
    from loadtests.kv_flood import PER_MESSAGE
    from loadtests.kv_ingest_cost import measure

    got = asyncio.run(measure(rate=8_000, seconds=1.0))
    assert got["events"] >= 8_000 - PER_MESSAGE and got["sidecar_us"] > 0 and got["loop_us"] > 0


def test_kv_flood_skip_set_updates_keeps_each_deltas_state_but_no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    from array import array

    from router.state import precise_mirror

    monkeypatch.setenv("KV_FLOOD_SKIP_SET_UPDATES", "1")
    monkeypatch.setattr(precise_mirror.MirrorTable, "apply_part", precise_mirror.MirrorTable.apply_part)  # undone after
    path = Path(__file__).resolve().parent.parent / "loadtests" / "kv_flood_skip" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("kv_flood_skip_sitecustomize", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    mirror = precise_mirror.MirrorTable(10)
    delta = precise_mirror.TableDelta(True, 3, 1, False, array("Q", [1, 2, 3]))
    assert mirror.apply_part(delta, 0, 2) == 2 and not mirror.fresh  # the state comes with the last slice
    assert mirror.apply_part(delta, 2, 2) == 3 and mirror.fresh and len(mirror) == 3 and mirror.overflow == 1
    assert mirror.depth([1, 2], 0.8) == 0.0


def test_a_baseline_gets_this_trees_c_extensions_only_while_their_sources_are_the_same(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "router" / "request").mkdir(parents=True)
    (root / "router" / "request" / "_chain.c").write_text("int x;\n")
    (root / "router" / "request" / "_chain.cpython-311-x86_64-linux-gnu.so").write_bytes(b"built")
    (root / "router" / "request" / "vendor").mkdir()
    (root / "router" / "request" / "vendor" / "xxhash.h").write_text("/* v1 */\n")
    base = tmp_path / "base"
    (base / "router" / "request" / "vendor").mkdir(parents=True)
    (base / "router" / "request" / "_chain.c").write_text("int x;\n")
    (base / "router" / "request" / "vendor" / "xxhash.h").write_text("/* v0 */\n")
    assert overhead.copy_extensions(base, root) == []  # a header differs: the build would not be this one
    assert not (base / "router" / "request" / "_chain.cpython-311-x86_64-linux-gnu.so").exists()
    (base / "router" / "request" / "vendor" / "xxhash.h").write_text("/* v1 */\n")
    assert overhead.copy_extensions(base, root) == ["router/request/_chain.cpython-311-x86_64-linux-gnu.so"]
    assert (base / "router" / "request" / "_chain.cpython-311-x86_64-linux-gnu.so").read_bytes() == b"built"


def test_a_baseline_directory_is_used_as_it_is_and_named_by_its_name(tmp_path: Path) -> None:
    tree = tmp_path / "compiled-tree"
    (tree / "router").mkdir(parents=True)
    assert overhead.source_label(str(tree)) == "compiled-tree"
    with overhead.router_source(str(tree)) as source:
        assert source == tree
    with pytest.raises(SystemExit, match="must hold the router package"), overhead.router_source(str(tmp_path)):
        pass
    with overhead.router_source("HEAD") as unpacked:  # a git ref: this checkout's router package, unpacked
        assert (unpacked / "router" / "request" / "service.py").exists()
        built = sorted(p.name for p in (overhead.ROOT / "router").rglob("*.so"))
        same_c = overhead._c_sources(unpacked) == overhead._c_sources(overhead.ROOT)
        assert sorted(p.name for p in (unpacked / "router").rglob("*.so")) == (built if same_c else [])


def test_real_vllm_quality_reports_what_the_engines_measured() -> None:
    from loadtests import real_vllm_prediction as rv
    from loadtests import real_vllm_quality as rq

    args = rq.parse_args([])
    assert args.tenants == [8, 16, 32] and list(args.routers) == list(rq.DEFAULT_ROUTERS) and not args.write
    assert "pd-router unlearned" not in args.routers  # the token ratio's control runs on request
    assert rq.parse_args(["--routers", "pd-router unlearned"]).routers == ["pd-router unlearned"]
    assert set(rq.OURS.values()) <= set(rv.SETUPS)  # pd-router's rows are set up as the prediction benchmark's
    assert rv.SETUPS[rq.OURS["pd-router unlearned"]](None)["engines"]["learn_token_ratio"] is False
    run = rv.Run(ttft_s=[0.3, 0.1, 0.2, 0.4], cached_share=[0.5, 1.0, 0.0, 0.5], errors=1)
    r = rq.row("smg", run, hits=300.0, queries=400.0, split=[3.0, 1.0])
    assert r == ["smg", 4, 1, "0.500", "0.750", "3/1", "250", "300"]
    assert rq.row("smg", rv.Run(), 0.0, 0.0, [0.0, 0.0])[3:5] == ["nan", "-"]  # nothing answered: no made-up ratio
    with pytest.raises(SystemExit):
        rq.parse_args(["--routers", "pd-router", "nginx"])
    with pytest.raises(SystemExit):
        rq.parse_args(["--repeats", "0"])
    repeated = [(rv.Run(ttft_s=[0.1, 0.3]), 0.5), (rv.Run(ttft_s=[0.2, 0.6], errors=2), 0.7),
                (rv.Run(ttft_s=[0.1, 0.2]), 0.6)]
    assert rq.summary("pd-router", repeated) == ["pd-router", 3, 2, "0.600 (0.500-0.700)", "200", "100 (100-200)"]
    assert rq.Measured("1 tenants", "smg", run, 3.0, 4.0, [1.0, 1.0]).hit == 0.75
    assert math.isnan(rq.Measured("1 tenants", "smg", run, 0.0, 0.0, [0.0, 0.0]).hit)
    assert rv.p90([0.4, 0.1, 0.3, 0.2]) == 0.3
