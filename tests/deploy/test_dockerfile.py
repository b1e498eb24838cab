"""The Dockerfile's invariants, read with BuildKit's own parser (the `dockerfile` package) since
no Docker engine runs here: a base pinned by digest, dependencies only from the hashed lock,
LICENSE in the image, a health check on the port `serve` listens on, a non-root user."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import dockerfile
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from router.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"


@pytest.fixture(scope="module")
def stages() -> dict[str, list[dockerfile.Command]]:
    """Instructions per stage (by the name after AS), with ARG defaults substituted into FROM."""
    args: dict[str, str] = {}
    out: dict[str, list[dockerfile.Command]] = {}
    current: list[dockerfile.Command] | None = None
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "ARG" and current is None:
            name, _, default = cmd.value[0].partition("=")
            args[name] = default
        elif cmd.cmd == "FROM":
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], cmd.value[0])
            name = cmd.value[2] if len(cmd.value) == 3 and cmd.value[1].upper() == "AS" else image
            current = out.setdefault(name, [])
            current.append(cmd._replace(value=(image, *cmd.value[1:])))
        else:
            assert current is not None, f"{cmd.cmd} before FROM"
            current.append(cmd)
    return out


def commands(stage: list[dockerfile.Command], kind: str) -> list[dockerfile.Command]:
    return [c for c in stage if c.cmd == kind]


def pip_calls(stage: list[dockerfile.Command]) -> list[list[str]]:
    calls = []
    for run in commands(stage, "RUN"):
        for part in re.split(r"&&|;", run.value[0]):
            words = shlex.split(part)
            if words[:1] == ["pip"] or words[:3] == ["python", "-m", "pip"]:
                calls.append(words)
    return calls


def test_every_base_image_is_pinned_by_digest(stages):
    froms = [stage[0].value[0] for stage in stages.values()]
    assert froms and all(re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", f) for f in froms), froms
    assert len(set(froms)) == 1  # build and runtime start from the same bytes


def test_dependencies_come_only_from_the_hashed_lock(stages):
    build, runtime = stages["build"], stages["runtime"]
    copied = [c.value[:-1] for c in commands(build, "COPY")]
    assert ("requirements.lock",) in copied
    calls = pip_calls(build) + pip_calls(runtime)
    assert calls
    for words in calls:
        if words[1] == "check":
            continue
        if "--no-deps" in words and ("--no-index" in words or words[-1] == "."):
            continue  # the wheels built from the lock, or the project itself
        assert "--require-hashes" in words and "requirements.lock" in words and "--only-binary=:all:" in words, words
    assert any(w[1] == "install" and "--no-index" in w for w in pip_calls(runtime))  # nothing fetched at runtime


def test_the_lock_pins_every_runtime_dependency_with_hashes():
    text = LOCK.read_text()
    assert "pip-compile" in text and "--generate-hashes" in text  # how to regenerate it: its header
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[a-z0-9])", text.split("\n", 6)[-1]):
        first = block.split()[0]
        name, _, version = first.partition("==")
        assert version, f"unpinned: {first}"
        assert "--hash=sha256:" in block, f"no hash for {name}"
        pins[canonicalize_name(name)] = version
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in map(Requirement, deps):
        name = canonicalize_name(dep.name)
        assert name in pins, f"{dep.name} is not in requirements.lock: regenerate it"
        assert dep.specifier.contains(pins[name]), f"{dep.name}=={pins[name]} does not satisfy {dep.specifier}"
    for extra in ("uvloop", "httptools", "watchfiles", "websockets"):  # uvicorn[standard]
        assert extra in pins


def test_license_is_in_the_image(stages):
    runtime = stages["runtime"]
    assert any(c.value[0] == "LICENSE" and "/usr/share/doc/pd-router" in c.value[-1] for c in commands(runtime, "COPY"))
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    labels = dict(zip(*[iter(v for c in commands(runtime, "LABEL") for v in c.value)] * 2))
    assert labels["org.opencontainers.image.licenses"].strip('"') == "Apache-2.0"
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:] and {"!LICENSE", "!requirements.lock", "!pyproject.toml", "!router/"} <= set(ignore)


def test_health_check_uses_the_port_serve_listens_on(stages, monkeypatch):
    runtime = stages["runtime"]
    env = dict(zip(*[iter(v for c in commands(runtime, "ENV") for v in c.value)] * 2))
    [health] = commands(runtime, "HEALTHCHECK")
    probe = " ".join(health.value)
    assert "os.environ.get('PDR_PORT'" in probe and "/health" in probe and "8080/" not in probe
    [cmd] = commands(runtime, "CMD")
    assert cmd.json and "--port" not in cmd.value and not any(v.startswith("--port") for v in cmd.value)
    # So serve takes its port from the same variable.
    monkeypatch.setenv("PDR_PORT", "9123")
    monkeypatch.setenv("PDR_HOST", env["PDR_HOST"])
    args = build_parser().parse_args(list(cmd.value))
    assert (args.port, args.host) == (9123, "0.0.0.0")
    assert env["PDR_PORT"] == commands(runtime, "EXPOSE")[0].value[0] == "8080"


def test_runs_as_a_numeric_non_root_user(stages):
    runtime = stages["runtime"]
    users = commands(runtime, "USER")
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].value[0].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0)
    assert runtime.index(users[-1]) > max(runtime.index(c) for c in commands(runtime, "RUN"))
    [entry] = commands(runtime, "ENTRYPOINT")
    assert entry.value == ("pd-router",)


def test_the_c_extension_is_compiled_in_the_build_stage_only_and_checked_in_the_wheel(stages):
    """router/state/_keyset.c, _tracked.c and router/request/_chain.c are optional in pyproject
    (an install without a compiler runs on Python sets, tables and hashing), so the build stage,
    which has gcc, must fail if the wheel lacks any; the runtime stage stays without a compiler, and no host-built .so
    enters the context."""
    build = " && ".join(c.value[0] for c in commands(stages["build"], "RUN"))
    runtime = " && ".join(c.value[0] for c in commands(stages["runtime"], "RUN"))
    assert re.search(r"apt-get install [^&]*\bgcc\b", build) and "libc6-dev" in build
    assert "rm -rf /var/lib/apt/lists" in build
    assert "apt-get" not in runtime and "gcc" not in runtime
    [wheel] = [part for part in build.split("&&") if "pip wheel" in part and "--no-deps" in part]
    check = build[build.index(wheel):]
    modules = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    assert [m["name"] for m in modules] == ["router.state._keyset", "router.state._tracked", "router.request._chain"]
    assert all(m["optional"] for m in modules)
    for m in modules:
        assert f"zipfile -l /wheels/pd_router-*.whl | grep -q '{m['name'].replace('.', '/')}\\.'" in check
    for source in (s for m in modules for s in m["sources"]):
        assert source.startswith("router/") and (ROOT / source).is_file()  # in the context: .dockerignore lets router/ in
    assert "**/*.so" in (ROOT / ".dockerignore").read_text().split()
