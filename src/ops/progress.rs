//! Progress for long work (the demo, tier release, redrive): a bar on a terminal, a line every
//! two seconds otherwise, so CI logs and pipes still show that something moves.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: AtomicU64,
    noun: &'static str,
    last_line: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("total", &self.total.load(Ordering::Relaxed))
            .finish()
    }
}

impl Progress {
    /// `noun` says what is counted: "finished", "moved".
    pub fn new(total: u64, noun: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{spinner}} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {noun}  {{msg}}"
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        Self {
            bar,
            total: AtomicU64::new(total),
            noun,
            last_line: Mutex::new(None),
        }
    }

    pub fn set(&self, done: u64, message: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(done);
                bar.set_message(message.to_owned());
            }
            None => {
                let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
                let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(2));
                let total = self.total.load(Ordering::Relaxed);
                if due || done >= total {
                    eprintln!("  {done}/{total} {}: {message}", self.noun);
                    *last = Some(Instant::now());
                }
            }
        }
    }

    /// The total, once it is known (a stream's window, say).
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
