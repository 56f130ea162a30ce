# Build stage: compile the release binary with the locked dependency set.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY tools ./tools
COPY topology ./topology
COPY rabbitmq ./rabbitmq
RUN cargo build --release --locked --bin hookrelay

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
