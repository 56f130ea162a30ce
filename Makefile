# The two commands README starts with. Both bring up a local RabbitMQ first if none answers;
# the tests also a PostgreSQL, Debian's Chromium with its ChromeDriver for the browser tests, and
# promtool for the alert rules.
.PHONY: demo test broker database browser monitoring check

# The whole path end to end: ladder, endpoint, worker, 1000 events, a table.
demo: broker
	cargo run --release --quiet -p hookrelay-tools --bin hookrelay-dev -- demo

# Format, lint, every test against the real broker, then the fault suite (which starts broker
# nodes of its own on other ports and never touches the shared one).
test: broker database browser monitoring check
	cargo nextest run --workspace --all-targets --no-fail-fast -E 'not binary(faults)'
	cargo test --doc --workspace --quiet
	cargo nextest run --test faults --no-fail-fast --no-capture

broker:
	rabbitmq/up

database:
	postgres/up

browser:
	browser/up

monitoring:
	monitoring/up

check:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
