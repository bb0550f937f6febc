# kvrouter, kvworker (and its adapter), kvengine, kvbench and kvsim in one small Debian image (used by docker-compose.yml).
#
#   docker build -t kvrouter:local .
#   docker run --rm kvrouter:local kvrouter --help
#
# Two stages: `build` installs the project's own package list (scripts/deps.sh, the same list the
# README's commands use) and builds with meson in release mode; `runtime` holds the binaries, the
# shared libraries they link (nats.c, protobuf-c, xxHash, libmicrohttpd, libevent; libcurl,
# libzmq and msgpack-c for the adapter and the engine stand-in) and traces/ for kvbench's trace workloads.
# The library package names below are bookworm's (nats.c 3.4.1, as on the development machines).

ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The package list first, so that a source change does not reinstall it.
COPY scripts/deps.sh scripts/deps.sh
RUN bash scripts/deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# Release build without the test suites; `meson install --strip` puts the four programs in
# /stage/usr/local/bin without their debug information.
RUN bash scripts/build.sh build --buildtype=release -Dtests=false \
    && meson install -C build --destdir /stage --strip --no-rebuild >/dev/null \
    && ls -l /stage/usr/local/bin

FROM ${DEBIAN_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends libnats3.4 libprotobuf-c1 libxxhash0 libmicrohttpd12 libevent-2.1-7 libevent-pthreads-2.1-7 \
         libcurl4 libzmq5 libmsgpackc2 libjansson4 >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /opt/kvrouter \
       --shell /usr/sbin/nologin kvr
COPY --from=build /stage/usr/local/bin/ /usr/local/bin/
WORKDIR /opt/kvrouter
COPY traces/ traces/
# out/ is where `kvbench --out out/...` writes (the compose file mounts a volume there). The
# loop fails the build if a shared library is missing.
RUN mkdir out && chown kvr:kvr out \
    && for p in kvrouter kvworker kvengine kvbench kvsim; do \
         if ldd "/usr/local/bin/$p" | grep 'not found'; then exit 1; fi; \
         "$p" --help >/dev/null; \
       done
USER kvr
LABEL org.opencontainers.image.title="kvrouter" \
      org.opencontainers.image.description="KV-cache-aware LLM request router on NATS, with a simulated worker and a load generator" \
      org.opencontainers.image.licenses="Apache-2.0"
# Every program reads its options from flags or KVR_* variables (KVR_NATS: comma-separated URLs).
CMD ["kvrouter"]
