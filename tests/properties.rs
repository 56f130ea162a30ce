//! Property tests (many generated cases) for the two pure functions hostile input reaches first:
//! reading a delivery as an envelope, and deciding what happens after an attempt. Neither may
//! panic on anything a client can send; both must keep their promises on what they accept.

use std::time::Duration;

use hookrelay::contract::envelope::{Envelope, check_event_type, check_id, check_tenant};
use hookrelay::contract::headers;
use hookrelay::contract::ladder::Ladder;
use hookrelay::delivery::route::{AttemptResult, DeadReason, DeferCause, Outcome, decide};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use proptest::prelude::*;

fn header_names() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(headers::SUBSCRIPTION_HEADER.to_owned()),
        Just(headers::TENANT_HEADER.to_owned()),
        Just(headers::ATTEMPTS_HEADER.to_owned()),
        Just(headers::DUE_HEADER.to_owned()),
        Just(headers::EVENT_ID_HEADER.to_owned()),
        Just(headers::ENDPOINT_HEADER.to_owned()),
        Just("x-death".to_owned()),
        "[a-z-]{1,20}",
    ]
}

fn values() -> impl Strategy<Value = AMQPValue> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f64>().prop_map(AMQPValue::Double),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        ".{0,40}".prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        "[a-z_]{0,40}".prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
        "(acme|globex)".prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        Just(AMQPValue::Void),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            proptest::collection::vec(("[a-z-]{1,10}", inner), 0..4).prop_map(|kv| {
                let mut t = FieldTable::default();
                for (k, v) in kv {
                    t.insert(k.into(), v);
                }
                AMQPValue::FieldTable(t)
            }),
        ]
    })
}

fn bodies() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..600),
        Just(br#"{"ok":true}"#.to_vec()),
        "[\\[\\]{}\",:0-9a-z ]{0,200}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn reading_a_delivery_never_panics_and_accepts_only_the_contract(
        id in proptest::option::of(prop_oneof![".{0,200}", "[A-Za-z0-9_-]{1,40}"]),
        kind in proptest::option::of(prop_oneof!["[ -~]{0,140}", "[a-z]{1,8}\\.[a-z]{1,8}"]),
        headers in proptest::collection::vec((header_names(), values()), 0..6),
        routing_key in prop_oneof!["[ -~]{0,80}", "(retry-10s\\.)?(acme|globex)"],
        tenant_header in proptest::option::of(prop_oneof!["acme|globex", ".{0,300}"]),
        body in bodies(),
    ) {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(k.as_str().into(), v);
        }
        if let Some(tenant) = tenant_header {
            table.insert(
                headers::TENANT_HEADER.into(),
                AMQPValue::LongString(LongString::from(tenant)),
            );
        }
        let mut props = BasicProperties::default().with_headers(table);
        if let Some(id) = id.filter(|i| i.len() <= 255) {
            props = props.with_message_id(id.as_str().into());
        }
        if let Some(kind) = kind {
            props = props.with_type(kind.as_str().into());
        }
        if let Ok(e) = Envelope::from_delivery(&props, &routing_key, &body, 512) {
            prop_assert!(check_id(e.id.as_str()).is_ok());
            prop_assert!(check_tenant(&e.tenant).is_ok());
            // The tenant is the routing key's: the key itself, or after the tier in `<tier>.<tenant>`.
            let routed = routing_key.split_once('.').map_or(routing_key.as_str(), |(_, t)| t);
            prop_assert_eq!(e.tenant.as_str(), routed);
            prop_assert!(check_event_type(&e.event_type).is_ok());
            prop_assert!(body.len() <= 512);
            prop_assert!(serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok());
            prop_assert!(e.attempts_made <= 10_000);
        }
    }
}

fn results() -> impl Strategy<Value = AttemptResult> {
    prop_oneof![
        (0u16..1000, proptest::option::of(0u64..200_000)).prop_map(|(status, ra)| {
            AttemptResult::Response {
                status,
                retry_after: ra.map(Duration::from_secs),
            }
        }),
        Just(AttemptResult::Timeout),
        ".{0,20}".prop_map(AttemptResult::Transport),
        ".{0,20}".prop_map(AttemptResult::NotSent),
        ".{0,20}".prop_map(AttemptResult::EgressDenied),
        (
            ".{0,20}",
            0u64..200_000,
            0u8..3,
            proptest::option::of(0u64..u64::MAX),
            0u32..20,
        )
            .prop_map(|(reason, wait, kind, failed_try_ms, failed_in_a_row)| {
                AttemptResult::Deferred {
                    reason,
                    cause: match kind {
                        0 => DeferCause::Outage {
                            probe_in: Duration::from_secs(wait),
                            failed_try_ms,
                            failed_in_a_row,
                        },
                        1 => DeferCause::Busy {
                            quiet_for: Duration::from_millis(wait),
                            latency: Duration::from_millis(wait / 3),
                            turn_in: Duration::from_millis(wait / 2),
                        },
                        _ => DeferCause::OverRate,
                    },
                }
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn every_decision_stays_within_the_ladder(before in 0u32..30, result in results()) {
        let ladder = Ladder::parse(include_str!("../topology/ladder.toml")).unwrap();
        let max = ladder.max_attempts();
        match decide(&ladder, before, &result) {
            Outcome::Delivered { status } => {
                prop_assert!((200..300).contains(&status));
                let answered = matches!(result, AttemptResult::Response { .. });
                prop_assert!(answered);
            }
            Outcome::Retry { tier, attempts_made, .. } => {
                prop_assert_eq!(attempts_made, before + 1);
                prop_assert!(attempts_made < max, "a retry never goes past the budget");
                prop_assert!(tier.index() < ladder.tiers.len());
                // Never a shorter wait than the schedule's.
                prop_assert!(tier >= ladder.tier_after(attempts_made).unwrap());
            }
            Outcome::Dead { reason, attempts_made, .. } => {
                prop_assert_eq!(attempts_made, before + 1);
                if reason == DeadReason::Exhausted {
                    prop_assert!(attempts_made >= max);
                }
            }
            other => prop_assert!(false, "decide never yields {:?}", other),
        }
    }
}

/// The content-header frame `properties` travel in, as the AMQP client encodes it; encoding
/// fails on a short string over 255 bytes, so `Some` also means every short string is valid.
fn frame_len(properties: &BasicProperties) -> Option<usize> {
    let (encoded, _) = lapin::protocol::basic::gen_properties(properties)(Vec::new().into())
        .ok()?
        .into_inner();
    // Frame type, channel and size; class, weight and body size; the frame-end octet.
    Some(encoded.len() + 7 + 12 + 1)
}

/// RabbitMQ's default `frame_max`, which the test broker keeps.
const FRAME_MAX: usize = 131_072;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever headers a message the broker accepted came with, every copy hookrelay makes of
    /// it (a retry, a dead letter, a redrive, a fan-out delivery) can be published: its
    /// properties fit one frame, with room for the `x-delivery-count` a quorum queue adds.
    #[test]
    fn every_copy_hookrelay_republishes_fits_a_frame(
        long in proptest::collection::vec((header_names(), 0usize..140_000), 0..4),
        others in proptest::collection::vec((header_names(), values()), 0..6),
        tenant in proptest::option::of("[a-z]{1,64}"),
        error in ".{0,3000}",
        endpoint in proptest::option::of(".{0,300}"),
        // Where most trouble is: properties just under the frame limit.
        fill_to in proptest::option::of(FRAME_MAX - 4000..=FRAME_MAX),
    ) {
        let mut table = FieldTable::default();
        for (k, v) in others {
            table.insert(k.as_str().into(), v);
        }
        for (k, n) in long {
            table.insert(k.as_str().into(), AMQPValue::LongString("x".repeat(n).into()));
        }
        let with = |table: &FieldTable, fill: usize| {
            let mut table = table.clone();
            if fill > 0 {
                table.insert("x-fill".into(), AMQPValue::LongString("f".repeat(fill).into()));
            }
            BasicProperties::default()
                .with_message_id("evt_1".into())
                .with_type("order.paid".into())
                .with_headers(table)
        };
        let mut original = with(&table, 0);
        if let (Some(target), Some(now)) = (fill_to, frame_len(&with(&table, 1))) {
            // Each byte of the filler weighs one.
            if now <= target {
                original = with(&table, target - now + 1);
            }
        }
        // Only what the broker took can arrive.
        prop_assume!(frame_len(&original).is_some_and(|n| n <= FRAME_MAX));
        let dead = headers::dead_properties(
            &original,
            &headers::DeadLetter {
                reason: "invalid",
                error: &error,
                status: Some(400),
                attempts_made: 3,
                tenant: tenant.as_deref(),
            },
        );
        let copies = [
            headers::retry_properties(
                &original,
                tenant.as_deref().unwrap_or("acme"),
                3,
                u64::MAX,
                &error,
                endpoint.as_deref(),
                None,
            ),
            headers::redrive_properties(&dead),
            headers::fanout_properties(
                &original,
                &hookrelay::contract::envelope::derived_id("evt_1", "sub_a"),
                "sub_a",
                "evt_1",
            ),
            dead,
        ];
        for copy in &copies {
            let len = frame_len(copy);
            prop_assert!(len.is_some(), "a copy does not encode");
            prop_assert!(len.is_some_and(|n| n + 64 <= FRAME_MAX), "{:?} bytes", len);
        }
    }
}
