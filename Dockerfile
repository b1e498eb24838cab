# syntax=docker/dockerfile:1
# pd-router image: build a wheel, then install it (and only it) in a slim runtime.
#   docker build -t pd-router:0.1.0 .
#   docker run -p 8080:8080 -v $PWD/config.yaml:/etc/pd-router/config.yaml:ro pd-router:0.1.0

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
# The project's wheel plus wheels of all its dependencies, for an offline install below.
RUN pip wheel --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels pd-router \
 && groupadd --system --gid 10001 pdrouter \
 && useradd --system --uid 10001 --gid pdrouter --no-create-home --shell /usr/sbin/nologin pdrouter \
 && mkdir -p /etc/pd-router \
 && printf 'instances: []\nstate:\n  backend: memory\n' > /etc/pd-router/config.yaml
# Mount your own /etc/pd-router/config.yaml, or override fields with PD_ROUTER_* variables.

USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
ENTRYPOINT ["pd-router"]
CMD ["serve", "--config", "/etc/pd-router/config.yaml", "--host", "0.0.0.0", "--port", "8080"]
