"""``pd-router replay``: outputs on disk, deterministic summary, clear errors."""

import importlib.util
import json

import pytest

from router.cli import main

SPEC = "synthetic:shared_prefix:groups=4,users=2,system=1024,question=256,output=16,stages=4x10"


def run(tmp_path, *extra):
    return main(["replay", SPEC, "--mixed", "2", "--cache-tokens", "200000", "--quiet", *extra])


def test_replay_writes_summary_table_and_plots(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(tmp_path, "--out", str(out), "--policy", "random", "ttft", "--ttft-slo", "1") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["random", "ttft", "bound", "lru_alone"]
    assert all(s["requests"] == summary[0]["requests"] > 10 and s["slo_s"] == 1.0 for s in summary)
    assert "gap_closed" in summary[1] and "| bound |" in (out / "summary.md").read_text()
    table = (out / "summary.md").read_text()
    assert "| ttft |" in table and "TTFT p90 s" in table
    assert "| random |" in capsys.readouterr().out
    assert set(json.loads((out / "timing.json").read_text())) == {"random", "ttft"}
    if importlib.util.find_spec("matplotlib") is not None:
        assert all((out / f).stat().st_size > 1000 for f in ("ttft_cdf.png", "load.png", "hit_ratio.png"))
    else:
        assert "matplotlib is not installed" in table


def test_same_seed_gives_a_byte_identical_summary(tmp_path):
    for name in ("a", "b"):
        assert run(tmp_path, "--out", str(tmp_path / name), "--policy", "random", "llmd_weighted", "--seed", "3") == 0
    assert (tmp_path / "a" / "summary.json").read_bytes() == (tmp_path / "b" / "summary.json").read_bytes()


def test_limit_and_rate_scale_apply(tmp_path):
    assert run(tmp_path, "--out", str(tmp_path / "o"), "--policy", "round_robin", "--limit", "7", "--rate-scale", "2") == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())[0]["requests"] == 7


def test_missing_trace_and_bad_options_fail_with_a_message(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "absent.jsonl"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "absent.jsonl: no such trace file" in err and "not in the repository" in err
    assert main(["replay", SPEC, "--rate-scale", "0"]) == 2
    assert main(["replay", SPEC, "--prefill", "1", "--mixed", "0"]) == 2
    assert "decode or mixed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", SPEC, "--policy", "nope"])
