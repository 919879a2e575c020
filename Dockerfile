# The sqlhttpd image, built where a container registry answers: `docker build .` (or
# `docker build -t sqlhttpd .`). Two stages: the official Rust image (Debian bookworm, the
# workspace's rust-version) compiles a statically linked sqlhttpd (glibc's crt-static; SQLite is
# bundled, Mozilla's roots are compiled in), and the final stage is the `FROM scratch` image
# scripts/build-image gives on a machine without a registry (docker/Dockerfile): the same user,
# port, volume, entrypoint and environment, held equal by integration-tests/tests/dockerfiles.rs.
# The release workflow (.github/workflows/release.yml) builds this file for ghcr.io.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY . .
# The explicit --target keeps crt-static off build scripts and proc macros; a binary that still
# needs a shared library fails the build (the final stage has none). `out/` is laid out as
# scripts/build-image lays out its context: the binary, an empty data/ and an empty tmp/.
RUN target="$(rustc -vV | sed -n 's/^host: //p')" \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p sqlhttp-server --bin sqlhttpd --target "$target" \
 && mkdir /out \
 && cp "target/$target/release/sqlhttpd" /out/sqlhttpd \
 && strip /out/sqlhttpd \
 && if readelf -d /out/sqlhttpd | grep -q "(NEEDED)"; then echo "sqlhttpd is dynamically linked" >&2; exit 1; fi \
 && mkdir -m 0750 /out/data \
 && mkdir -m 1777 /out/tmp

FROM scratch AS sqlhttpd

COPY --from=builder --chown=10001:10001 /out/data/ /data/
COPY --from=builder --chown=10001:10001 /out/tmp/ /tmp/
COPY --from=builder /out/sqlhttpd /sqlhttpd

ENV SQLHTTPD_LISTEN=0.0.0.0:8080 \
    SQLHTTPD_DATABASE=sqlite:/data/sqlhttp.db \
    TMPDIR=/tmp

USER 10001:10001
VOLUME ["/data"]
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/sqlhttpd"]
