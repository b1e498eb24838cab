# syntax=docker/dockerfile:1
# pd-router image: the locked dependencies and the project's wheel, installed in a slim runtime.
#   docker build -t pd-router:0.1.0 .
#   docker run -p 8080:8080 -v $PWD/config.yaml:/etc/pd-router/config.yaml:ro pd-router:0.1.0
#
# The base is pinned by digest (the multi-arch index of python:3.11-slim), so a rebuild starts
# from the same bytes whatever the tag points to later. This digest was not pulled here (no
# Docker engine): it is the one that public BuildKit logs show `docker.io/library/python:3.11-slim`
# resolving to, and that several unrelated projects pin for that tag. Move it deliberately:
#   docker buildx imagetools inspect python:3.11-slim    # "Digest:" of the index
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies exactly as requirements.lock pins them (pip-compile --generate-hashes over
# pyproject.toml), each download checked against its hash; wheels only, so nothing is compiled.
COPY requirements.lock ./
RUN pip wheel --wheel-dir /wheels --require-hashes --only-binary=:all: --requirement requirements.lock
# Then the project's own wheel, without resolving its dependencies again. It compiles the
# mirror tables' key sets (router/state/_keyset.c), the sidecar's engine-block tables
# (router/state/_tracked.c) and the chained block keys (router/request/_chain.c): a C
# compiler in this stage only (the runtime gets the built wheel), and a check that the wheel
# holds the three extensions, which the build would otherwise skip quietly (they are
# optional, for installs without a compiler).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN pip wheel --wheel-dir /wheels --no-deps . \
 && python -m zipfile -l /wheels/pd_router-*.whl | grep -q 'router/state/_keyset\.' \
 && python -m zipfile -l /wheels/pd_router-*.whl | grep -q 'router/state/_tracked\.' \
 && python -m zipfile -l /wheels/pd_router-*.whl | grep -q 'router/request/_chain\.'

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="pd-router" \
      org.opencontainers.image.description="Cache-aware prefill/decode router for vLLM and SGLang" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PDR_HOST=0.0.0.0 \
    PDR_PORT=8080
# Exactly the wheels built above (no index, no resolution), then a consistency check.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --no-deps /wheels/*.whl \
 && pip check \
 && groupadd --system --gid 10001 pdrouter \
 && useradd --system --uid 10001 --gid pdrouter --no-create-home --shell /usr/sbin/nologin pdrouter \
 && mkdir -p /etc/pd-router \
 && printf 'instances: []\nstate:\n  backend: memory\n' > /etc/pd-router/config.yaml
COPY LICENSE /usr/share/doc/pd-router/LICENSE
# Mount your own /etc/pd-router/config.yaml, or override fields with PD_ROUTER_* variables.
# PDR_PORT (and PDR_HOST) set where `serve` listens and where the health check looks.

USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PDR_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["pd-router"]
CMD ["serve", "--config", "/etc/pd-router/config.yaml"]
