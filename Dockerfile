# syntax=docker/dockerfile:1
# One image with all four binaries: hookline (CLI), hookline-ingest, hookline-dispatcher, hookline-retry-scheduler.
# Pick the binary with the container command, e.g. `docker run IMAGE hookline-dispatcher --config /etc/hookline/hookline.toml`.
#
# Building needs only cargo and a C toolchain: rdkafka-sys builds librdkafka from source (make, perl/python3 in
# its configure), against Debian's OpenSSL (libssl-dev, pkg-config) for TLS and SASL, and libz-sys builds or links
# zlib. rust:1-bookworm has all of them; the runtime image needs libssl3.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p hookline-cli -p hookline-ingest -p hookline-dispatcher -p hookline-retry-scheduler \
 && mkdir -p /out \
 && cp target/release/hookline target/release/hookline-ingest \
       target/release/hookline-dispatcher target/release/hookline-retry-scheduler /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 hookline \
 && useradd --system --uid 10001 --gid hookline --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin hookline \
 && mkdir -p /var/lib/hookline/data && chown -R 10001:10001 /var/lib/hookline
COPY --from=build /out/ /usr/local/bin/
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# Writable by the user: the delivery log's default SQLite file is data/delivery-log.sqlite3 under it.
WORKDIR /var/lib/hookline
# ingest API + health (8080), dispatcher health (9091), retry-scheduler health (9092).
EXPOSE 8080 9091 9092
# SIGTERM drains (dispatcher: up to dispatcher.drain_timeout_ms); give containers a stop grace period above it.
STOPSIGNAL SIGTERM
CMD ["hookline", "--help"]
