# The two commands README starts with. Both bring up a local RabbitMQ first if none answers.
.PHONY: demo test broker check unit

# The whole path end to end: ladder, endpoint, worker, 1000 events, a table.
demo: broker
	cargo run --release --quiet -- demo

# Format, lint and every test against the real broker.
test: broker check
	cargo nextest run --workspace --all-targets --no-fail-fast
	cargo test --doc --quiet

broker:
	rabbitmq/up

check:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
