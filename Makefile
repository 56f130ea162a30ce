# The two commands README starts with. Both bring up a local RabbitMQ first if none answers;
# the tests also a RabbitMQ 4 node of their own (rabbitmq/v4), a PostgreSQL, Debian's Chromium
# with its ChromeDriver for the browser tests, and promtool for the alert rules.
.PHONY: demo test stack broker broker4 database browser monitoring check

# The whole path end to end: ladder, endpoint, worker, 1000 events, a table.
demo: broker
	cargo run --release --quiet -p hookrelay-tools --bin hookrelay-dev -- demo

# The tests that talk to the broker about its own behaviour (the ladder, delivery, retries,
# streams, operations); they run on both brokers. The rest (the API, the store, the pages) run
# on RabbitMQ 4 only: what they ask of the broker, the core already asks. docs/brokers.md.
CORE = binary(amqp) | binary(delivery) | binary(filters) | binary(fleet) | binary(history) \
	| binary(invalid) | binary(isolation) | binary(live) | binary(operating) | binary(publish) \
	| binary(refusals) | binary(resilience) | binary(seams) | binary(shards) | binary(streams) \
	| binary(topology) | binary(traces)
# The fault scenarios that disturb the broker itself, run on both; the others (endpoint faults,
# hostile input, operator tools killed, bad configuration), those that need RabbitMQ 4 nodes
# (Khepri, the partition) and the cluster node loss run on RabbitMQ 4 only: on 3.10 the last
# strands dead letters in a tier about one run in five (rabbitmq-server#7677), and its account
# then waits out its whole three-minute settle, which CI cannot spare.
BROKER_FAULTS = test(/^(alarms|broker|worker_kill)::/)
# Points the tests at the RabbitMQ 4 node and its folder (rabbitmq/v4 env).
ON4 = eval "$$(rabbitmq/v4 env)" &&

# Format, lint, then every test on RabbitMQ 4 (rabbitmq/v4's node) and the broker-facing core
# on the machine's broker (3.10 here), then the fault suite on RabbitMQ 4 and its broker
# scenarios on the machine's (the suite starts broker nodes of its own on other ports, from
# rabbitmq/v4's folder for the RabbitMQ 4 run, and never touches the shared ones). Last, no
# deprecated feature was used on the RabbitMQ 4 node.
test: broker broker4 database browser monitoring check
	$(ON4) cargo nextest run --workspace --all-targets --no-fail-fast -E 'not binary(faults)'
	cargo nextest run --workspace --all-targets --no-fail-fast -E '$(CORE)'
	cargo test --doc --workspace --quiet
	$(ON4) cargo nextest run --test faults --no-fail-fast --no-capture
	cargo nextest run --test faults --no-fail-fast --no-capture -E '$(BROKER_FAULTS)'
	rabbitmq/v4 deprecated

# The container stack end to end (compose.yaml, the image, foreign clients); its own target,
# run at every change to Dockerfile, compose.yaml or deploy/: building the image takes minutes.
stack:
	deploy/smoke

broker:
	rabbitmq/up

broker4:
	rabbitmq/v4 up

database:
	postgres/up

browser:
	browser/up

monitoring:
	monitoring/up

check:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
