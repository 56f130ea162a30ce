# hookrelay's image: the release binary, stripped, on Debian 12 slim, run as a user without
# privileges. One image runs every part: `worker` (the default), `api`, `history`,
# `topology apply`, `store migrate`. compose.yaml runs the whole stack from it.
#
# Base images: the official rust and debian images; on a machine without a registry,
# deploy/images builds images of the same names from Debian's packages.

# Build stage: the dependencies first, in a layer of their own (a change to hookrelay's sources
# rebuilds only hookrelay), then the binary, with the locked dependency set.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY tools/Cargo.toml tools/Cargo.toml
RUN mkdir -p src tools/src \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && echo 'fn main() {}' > tools/src/main.rs && touch tools/src/lib.rs \
 && cargo build --release --locked --bin hookrelay \
 && rm -rf src tools/src
COPY src ./src
COPY tools ./tools
COPY migrations ./migrations
COPY topology ./topology
COPY rabbitmq ./rabbitmq
# The stubs' build is newer than the copied sources: mark them changed so cargo rebuilds.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin hookrelay \
 && strip target/release/hookrelay \
 && ./target/release/hookrelay --version

# Runtime stage: the binary, the default ladder, CA roots, and a user without privileges.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin hookrelay
WORKDIR /app
COPY --from=build /src/target/release/hookrelay /usr/local/bin/hookrelay
COPY topology ./topology
USER hookrelay
ENTRYPOINT ["hookrelay"]
CMD ["worker"]
