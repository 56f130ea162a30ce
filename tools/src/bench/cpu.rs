//! Where a run's CPU went: the broker's, the consumer's (the raw loop or the worker) and the
//! bench's own (the sink answering the requests), per message, read from `/proc` (Linux).
//!
//! On a machine where the broker, the consumer and the sink share the cores, a throughput ratio
//! alone does not say who is the cost; these figures do. The consumer is a process the bench
//! started for the run, so all its CPU belongs to the run; the broker's and the bench's are
//! counted from just before the consumer starts until its last message is in.

use serde::Serialize;

/// The kernel's clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`): 100 on every
/// architecture Linux runs on, whatever the kernel's own tick rate.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time per message, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuPerMessage {
    /// `None` when no single RabbitMQ node runs on this machine (a remote broker, or several
    /// local nodes the bench cannot tell apart).
    pub broker_us: Option<f64>,
    pub consumer_us: f64,
    pub bench_us: f64,
}

/// The broker's and the bench's CPU when a run starts.
#[derive(Debug, Clone, Copy)]
pub struct CpuWindow {
    broker: Option<(u32, u64)>,
    bench: u64,
}

impl CpuWindow {
    /// Taken just before the consumer process starts.
    pub fn begin() -> Self {
        let broker = broker_pid().and_then(|pid| Some((pid, ticks(pid)?)));
        Self {
            broker,
            bench: self_ticks().unwrap_or(0),
        }
    }

    /// Per message over the run, once `messages` are through; `consumer` is the pid of the
    /// process the run started (all its CPU counts). `None` without `/proc`.
    pub fn end(&self, consumer: Option<u32>, messages: u64) -> Option<CpuPerMessage> {
        let consumer = ticks(consumer?)?;
        let bench = self_ticks()?.saturating_sub(self.bench);
        let broker = self
            .broker
            .and_then(|(pid, at)| Some(ticks(pid)?.saturating_sub(at)));
        Some(per_message(broker, consumer, bench, messages))
    }
}

/// Rolls the local broker's quorum-queue write-ahead log over, then waits (at most 15 s) until
/// the broker is quiet. RabbitMQ rolls that log over on its own at 512 MiB, about one bench run
/// of writes here, and then writes every live queue's entries out to its segment files: a
/// second or two of the broker's CPU landing in whichever run is on at the time, which made
/// single runs' broker figures jump by half. Rolled over before a run's backlog is published,
/// the log holds that backlog and the run without rolling over during it. `Err` says why it
/// could not (a remote broker, no `rabbitmqctl` here): the run is then measured as it falls.
pub async fn roll_broker_log() -> Result<(), String> {
    let Some(broker) = broker_pid() else {
        return Err("no single local RabbitMQ node".into());
    };
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["eval", "ra_log_wal:force_roll_over(ra_log_wal)."])
        .output()
        .await
        .map_err(|e| format!("rabbitmqctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "rabbitmqctl eval: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // Quiet: at most 50 ms of the broker's CPU in 250 ms, twice in a row.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut quiet = 0;
    let mut last = ticks(broker);
    while quiet < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let now = ticks(broker);
        quiet = match (last, now) {
            (Some(a), Some(b)) if b.saturating_sub(a) <= 5 => quiet + 1,
            _ => 0,
        };
        last = now;
    }
    Ok(())
}

/// Ticks spent into microseconds per message.
fn per_message(broker: Option<u64>, consumer: u64, bench: u64, messages: u64) -> CpuPerMessage {
    let us = |ticks: u64| ticks as f64 / TICKS_PER_SECOND * 1e6 / messages.max(1) as f64;
    CpuPerMessage {
        broker_us: broker.map(us),
        consumer_us: us(consumer),
        bench_us: us(bench),
    }
}

/// User plus system time of a whole process (every thread), in ticks.
fn ticks(pid: u32) -> Option<u64> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn self_ticks() -> Option<u64> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `utime + stime` from a `/proc/<pid>/stat` line. The command name (second field) is in
/// parentheses and may hold spaces and parentheses itself, so the fields are counted from the
/// last `)`.
fn parse_stat(line: &str) -> Option<u64> {
    let (_, rest) = line.rsplit_once(')')?;
    // After the name: state is field 3, utime field 14, stime field 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The one RabbitMQ node on this machine (an Erlang VM started with RabbitMQ's boot
/// arguments), if there is exactly one.
fn broker_pid() -> Option<u32> {
    let mut found = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if is_rabbitmq_node(&cmdline) {
            if found.is_some() {
                return None;
            }
            found = Some(pid);
        }
    }
    found
}

fn is_rabbitmq_node(cmdline: &[u8]) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let beam = args.first().is_some_and(|a| a.ends_with(b"beam.smp"));
    beam && args.contains(&b"rabbit".as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1 \
                    1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some(325));
        assert_eq!(parse_stat("4242 (short) S 1"), None);
    }

    #[test]
    fn ticks_become_microseconds_per_message() {
        // 1.5 s of the broker's CPU over 10,000 messages: 150 µs each.
        let cpu = per_message(Some(150), 50, 0, 10_000);
        assert_eq!(cpu.broker_us, Some(150.0));
        assert_eq!(cpu.consumer_us, 50.0);
        assert_eq!(cpu.bench_us, 0.0);
        assert_eq!(per_message(None, 1, 1, 0).broker_us, None);
    }

    #[test]
    fn a_rabbitmq_node_is_told_from_other_erlang_vms() {
        let node = b"/usr/lib/erlang/erts-13.1.5/bin/beam.smp\0-W\0w\0--\0-s\0rabbit\0boot\0";
        let other = b"/usr/lib/erlang/erts-13.1.5/bin/beam.smp\0--\0-s\0couch\0";
        assert!(is_rabbitmq_node(node));
        assert!(!is_rabbitmq_node(other));
        assert!(!is_rabbitmq_node(b"/bin/rabbit\0"));
    }

    #[test]
    fn this_process_has_a_cpu_time() {
        // Spin a little so the count is not zero on a fast machine.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(self_ticks().is_some_and(|t| t > 0));
    }
}
