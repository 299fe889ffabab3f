# shipper in a container: tails the host's log files and ships them to Elasticsearch or Logsene.
#
#   docker build -t shipper .
#   docker run -d --name shipper --restart unless-stopped --stop-timeout 30 \
#     -e LOGSENE_TOKEN=your-app-token \
#     -v /var/log:/var/log:ro \
#     -v shipper-state:/var/lib/shipper \
#     shipper
#
# The default config (config/logsene.yaml) reads LOGSENE_TOKEN, LOGSENE_RECEIVER (EU:
# https://logsene-receiver.eu.sematext.com) and SHIPPER_PATHS from the environment. Your own
# config instead: -v /etc/shipper/shipper.yaml:/etc/shipper/shipper.yaml:ro (readable by uid
# 999 or group adm). Keep the state volume: it holds the checkpoints and the disk queue, so a
# new container resumes where the old one stopped, without loss or duplicates.
# --stop-timeout 30 gives shipper time to flush on SIGTERM (docker's default is 10 s).

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SHIPPER_METRICS_LISTEN=0.0.0.0:9607

# A fixed uid, so volume ownership survives rebuilds; group adm (gid 4 on Debian and Ubuntu
# hosts too) reads most of a mounted /var/log.
RUN groupadd --system --gid 999 shipper \
 && useradd --system --uid 999 --gid shipper --groups adm --no-create-home \
      --home-dir /var/lib/shipper --shell /usr/sbin/nologin shipper \
 && mkdir -p /var/lib/shipper /etc/shipper \
 && chown shipper:shipper /var/lib/shipper \
 && chmod 0700 /var/lib/shipper

# .dockerignore admits only what the build needs (pyproject.toml, README.md, shipper/, config/).
# gcc compiles the C fast path for JSON lines (shipper/_native.c; the image has the Python
# headers) and is removed in the same layer; the import fails the build if it was not compiled.
# Unpinned apt packages: the compiler of the base image's Debian release, whatever its patch level.
COPY . /tmp/shipper-src
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install --no-cache-dir /tmp/shipper-src \
 && python -c "import shipper._native" \
 && apt-get purge -y --auto-remove gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && install -m 0644 /tmp/shipper-src/config/logsene.yaml /etc/shipper/shipper.yaml \
 && rm -rf /tmp/shipper-src

VOLUME /var/lib/shipper
EXPOSE 9607
WORKDIR /var/lib/shipper
# Numeric, so the runtime need not resolve the name; without an explicit group, the runtime
# still adds the user's supplementary groups (adm) from the image's /etc/group.
USER 999

# /health answers 200 while the pipeline runs (needs metrics.listen, on by default). On 0.0.0.0
# only /metrics and /health are served: /status (paths, hosts, errors) needs a loopback address
# or metrics.status: true (`docker exec shipper shipper status` reads state_dir/status.json).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9607/health', timeout=4)"]

ENTRYPOINT ["shipper", "run"]
CMD ["-c", "/etc/shipper/shipper.yaml"]
