# The Pallas xApp image for the OSC near-RT RIC (descriptor: descriptors/config-file.json).
#
#   docker build -f docker/xapp.Dockerfile -t registry.example.org/pallas-xapp:0.1.0 .
#
# Not built by this repository's tests (no Docker engine there, and OSC's package repository is
# out of reach); kept minimal and conventional, as OSC's own Python xApps are.

ARG PYTHON_IMAGE=python:3.11-slim

# Build stage: ricxappframe's redis client needs hiredis 2.0.0, which has no cp311 wheel, so
# the wheels are built with a compiler here and only the installed result is kept.
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pallas_common/ pallas_common/
COPY proto/ proto/
COPY xapp/ xapp/
RUN pip install --no-cache-dir --prefix=/install '.[xapp]'

FROM ${PYTHON_IMAGE}
# RMR, as OSC xApp images carry it: librmr_si.so and rmr_probe from OSC's rmr deb.
ARG RMR_VERSION=4.9.4
ARG RMR_DEB_URL=https://packagecloud.io/o-ran-sc/release/packages/debian/stretch/rmr_${RMR_VERSION}_amd64.deb/download.deb
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl ca-certificates \
 && curl -fsSL -o /tmp/rmr.deb "${RMR_DEB_URL}" \
 && dpkg -i /tmp/rmr.deb \
 && rm -f /tmp/rmr.deb \
 && ldconfig \
 && (test -x /usr/local/bin/rmr_probe || ln -s "$(command -v rmr_probe)" /usr/local/bin/rmr_probe) \
 && test -x /usr/local/bin/rmr_probe \
 && apt-get purge -y curl && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*

COPY --from=build /install /usr/local
COPY descriptors/ /opt/pallas/descriptors/
COPY docker/xapp-seed.rt /opt/pallas/route.rt

# CONFIG_FILE: where the onboarder's chart mounts the descriptor (its appenv sets it too).
# RMR_SEED_RT: a static seed route table until the routing manager pushes routes (port 4561).
ENV CONFIG_FILE=/opt/ric/config/config-file.json \
    RMR_SEED_RT=/opt/pallas/route.rt \
    RMR_ASYNC_CONN=0 \
    LD_LIBRARY_PATH=/usr/local/lib:/usr/local/lib64 \
    PALLAS_CONTROLS_SCHEMA=/opt/pallas/descriptors/schema.json \
    PYTHONUNBUFFERED=1

EXPOSE 4560 4561 8080
CMD ["pallas-xapp"]
