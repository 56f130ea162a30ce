//! The handlers of `/v1/replays`: a replay of archived events (what `hookrelay replay` does)
//! started as a job of this API process, its progress, and its cancellation. A tenant's token
//! replays only its own tenant's events, over a bounded window at a bounded pace. At most
//! `api.replays_running` run at once, `api.replays_per_tenant` of them started by one tenant's
//! tokens; the last [`KEPT`] are remembered until the API restarts (a job does not survive a
//! restart: start it again; receivers deduplicate by the original ids).
//!
//! Every job ends, and gives back its slot when it does: finished, failed with the reason
//! (a panic of its task included), or cancelled.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lapin::{Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use utoipa::ToSchema;

use crate::contract::envelope::{check_id, check_tenant};
use crate::ops::replay::{ReplayFilter, ReplayOptions, ReplayReport, new_id};
use crate::subscriptions::EventFilter;
use crate::units::{Rate, fmt_duration, now_rfc3339, parse_when};

use super::ApiState;
use super::auth::Scope;
use super::extract::json;
use super::problem::documented::{MalformedJson, NoSuchReplay, TooLarge, Unauthorized};
use super::problem::{ApiError, FieldError, Problem};
use super::quota::Limits;

/// Finished replays remembered for `GET`.
pub const KEPT: usize = 100;
/// How long a cancel waits for its job to stop before it answers.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// A replay to start: the archive's events accepted in a window, filtered.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateReplay {
    /// Accepted at or after: RFC 3339, or a duration ago (`"3h"`).
    #[schema(example = "2026-12-04T02:10:00Z")]
    pub from: String,
    /// Accepted before (RFC 3339 or a duration ago); absent: up to what the archive holds when
    /// the replay starts.
    #[schema(example = "2026-12-04T04:40:00Z")]
    pub to: Option<String>,
    /// Only this tenant's events; a tenant's token replays its own whatever this says.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// Only events for this subscription (and events fanned out to it).
    pub subscription: Option<String>,
    /// Only these event types: an exact type or a wildcard like `order.*`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Only the event of this id; `from` and `to` still bound what is read of the archive.
    #[schema(example = "ord_1234_paid")]
    pub event: Option<String>,
    /// Skip events whose every delivery succeeded, by the attempt log.
    #[serde(default)]
    pub only_undelivered: bool,
    /// Pace, e.g. `"200/s"`; absent: 1000/s. Replayed events share the first-attempt lane with
    /// every tenant's new events: keep it below what the workers deliver.
    #[schema(example = "200/s")]
    pub rate: Option<String>,
    /// Count what would be published, publish nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A replay job: what it was asked, where it is, how it ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReplayJob {
    /// `rpl_<hex>`: in `x-hookrelay-replay` of every copy, and in history.
    pub id: String,
    /// `running`, `finished`, `failed` or `cancelled`.
    pub state: String,
    pub from: String,
    pub to: Option<String>,
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// Only this event, when the replay named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    pub only_undelivered: bool,
    /// The pace it publishes at.
    pub rate: Option<String>,
    pub dry_run: bool,
    /// Archived events read in the window so far.
    pub read: u64,
    /// Of those, the ones the filters took.
    pub matched: u64,
    /// Matched, but delivered according to the attempt log.
    pub delivered_already: u64,
    /// Published again (in a dry run: that would have been).
    pub published: u64,
    /// Why it failed.
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
}

/// The replay jobs this process knows.
#[derive(Debug, Default)]
pub struct Jobs {
    jobs: HashMap<String, Job>,
    finished: VecDeque<String>,
}

#[derive(Debug)]
struct Job {
    view: ReplayJob,
    report: watch::Receiver<ReplayReport>,
    /// The tenant whose token started it (`None`: an admin's), for `api.replays_per_tenant`.
    started_by: Option<String>,
    /// Stops it: a cancel, or the API's shutdown (whose token this is a child of).
    cancel: CancellationToken,
    /// Becomes true once it has ended and given back its slot.
    ended: watch::Receiver<bool>,
}

impl Job {
    fn current(&self) -> ReplayJob {
        let mut view = self.view.clone();
        let report = self.report.borrow();
        view.read = report.read;
        view.matched = report.matched;
        view.delivered_already = report.delivered_already;
        view.published = report.published;
        view
    }

    fn running(&self) -> bool {
        self.view.state == "running"
    }

    /// Whether `scope` may see it: an admin sees every job, a tenant only its tenant's (another
    /// tenant's is answered as if it did not exist).
    fn seen_by(&self, scope: &Scope) -> bool {
        match scope {
            Scope::Admin => true,
            Scope::Tenant(own) => self.view.tenant.as_deref() == Some(own.as_str()),
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Finished,
    Failed(String),
    Cancelled,
}

impl Jobs {
    fn running(&self) -> usize {
        self.jobs.values().filter(|j| j.running()).count()
    }

    /// Whether one more may start, by `started_by`'s token: the process's slots and the
    /// tenant's.
    fn admit(&self, limits: &Limits, started_by: Option<&str>) -> Result<(), ApiError> {
        let running = self.running();
        if running >= limits.replays_running {
            return Err(ApiError::Conflict(format!(
                "{running} replays are running, the most at once (api.replays_running); wait for \
                 one to end (GET /v1/replays/{{id}}) or cancel one"
            )));
        }
        if let Some(tenant) = started_by {
            let own = self
                .jobs
                .values()
                .filter(|j| j.running() && j.started_by.as_deref() == Some(tenant))
                .count();
            if own >= limits.replays_per_tenant {
                return Err(ApiError::Conflict(format!(
                    "{own} of this tenant's replays are running, the most at once \
                     (api.replays_per_tenant); wait for one to end (GET /v1/replays/{{id}}) or \
                     cancel it (POST /v1/replays/{{id}}/cancel)"
                )));
            }
        }
        Ok(())
    }

    fn finish(&mut self, id: &str, ended: Ended) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if !job.running() {
            return;
        }
        let (state, error) = match ended {
            Ended::Finished => ("finished", None),
            Ended::Failed(e) => ("failed", Some(e)),
            Ended::Cancelled => ("cancelled", None),
        };
        job.view.state = state.into();
        job.view.error = error;
        job.view.finished_at = Some(now_rfc3339());
        self.finished.push_back(id.to_owned());
        while self.finished.len() > KEPT {
            if let Some(old) = self.finished.pop_front() {
                self.jobs.remove(&old);
            }
        }
    }
}

/// A running job's hold on its slot: whatever becomes of its task, dropping this ends the job
/// (failed, if nothing said how it ended) and so gives the slot back.
struct Slot {
    jobs: Arc<SharedJobs>,
    id: String,
    ended: watch::Sender<bool>,
    outcome: Option<Ended>,
}

impl Slot {
    fn end(mut self, outcome: Ended) {
        self.outcome = Some(outcome);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or_else(|| {
            Ended::Failed("the replay stopped without a result (see the API's log)".into())
        });
        if let Ended::Failed(e) = &outcome {
            warn!(replay = %self.id, error = %e, "Replay failed");
        }
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish(&self.id, outcome);
        self.ended.send_replace(true);
    }
}

/// Waits for a job's task and ends the job with what it says; a task that panicked ends it
/// failed, with the panic's message.
/// The slot is taken before the returned future is first polled, so a future dropped unpolled
/// ends the job too.
fn supervise(
    jobs: Arc<SharedJobs>,
    id: String,
    ended: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Ended>,
) -> impl Future<Output = ()> + Send {
    let slot = Slot {
        jobs,
        id,
        ended,
        outcome: None,
    };
    async move {
        slot.end(match task.await {
            Ok(ended) => ended,
            Err(e) if e.is_panic() => {
                let panic = e.into_panic();
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Ended::Failed(format!("the replay failed on an internal error: {message}"))
            }
            Err(e) => Ended::Failed(format!("the replay's task was stopped: {e}")),
        });
    }
}

/// The request checked: the replay's options, every problem named by its field. A tenant's
/// token replays at most `api.tenant_replay_window` at most at `api.tenant_replay_rate`.
fn options(req: &CreateReplay, scope: &Scope, limits: &Limits) -> Result<ReplayOptions, ApiError> {
    let mut errors = Vec::new();
    let from = parse_when(&req.from)
        .map_err(|e| errors.push(FieldError::new("from", e.to_string())))
        .ok();
    let to = match &req.to {
        None => None,
        Some(text) => parse_when(text)
            .map_err(|e| errors.push(FieldError::new("to", e.to_string())))
            .ok(),
    };
    if let (Some(from), Some(to)) = (from, to)
        && to <= from
    {
        errors.push(FieldError::new("to", "must be after from"));
    }
    if let Some(t) = &req.tenant
        && let Err(e) = check_tenant(t)
    {
        errors.push(FieldError::new("tenant", e.to_string()));
    }
    if let Some(s) = &req.subscription
        && let Err(e) = check_id(s)
    {
        errors.push(FieldError::new("subscription", e.to_string()));
    }
    if let Some(e) = &req.event
        && let Err(err) = check_id(e)
    {
        errors.push(FieldError::new("event", err.to_string()));
    }
    let event_type = match &req.event_type {
        None => None,
        Some(t) => EventFilter::parse(t)
            .map_err(|e| errors.push(FieldError::new("type", e.to_string())))
            .ok(),
    };
    let rate = match &req.rate {
        Some(text) => text
            .parse::<Rate>()
            .map_err(|e| errors.push(FieldError::new("rate", e.to_string())))
            .ok(),
        None => Some(default_rate(scope, limits)),
    };
    if let Scope::Tenant(_) = scope {
        tenant_bounds(from, to, rate, limits, &mut errors);
    }
    let (Some(from), true) = (from, errors.is_empty()) else {
        return Err(ApiError::Invalid(errors));
    };
    // A tenant's token replays its own tenant's events; naming another is answered as if that
    // tenant did not exist.
    let tenant = match scope {
        Scope::Admin => req.tenant.clone(),
        Scope::Tenant(own) => {
            if req.tenant.as_ref().is_some_and(|t| t != own) {
                return Err(ApiError::Absent("tenant"));
            }
            Some(own.clone())
        }
    };
    Ok(ReplayOptions {
        id: Some(new_id()),
        from,
        to,
        filter: ReplayFilter {
            tenant,
            subscription: req.subscription.clone(),
            event_type,
            event: req.event.clone(),
        },
        only_undelivered: req.only_undelivered,
        index_max: Some(limits.replay_index_max),
        rate,
        dry_run: req.dry_run,
    })
}

/// The replays' default pace, or a tenant's bound when that is slower.
fn default_rate(scope: &Scope, limits: &Limits) -> Rate {
    let default = crate::config::default_replay_rate();
    match scope {
        Scope::Tenant(_) if limits.tenant_replay_rate.per_second() < default.per_second() => {
            limits.tenant_replay_rate
        }
        _ => default,
    }
}

/// A tenant's window (`to`, or now, less `from`) and pace within `[api]`'s bounds.
fn tenant_bounds(
    from: Option<SystemTime>,
    to: Option<SystemTime>,
    rate: Option<Rate>,
    limits: &Limits,
    errors: &mut Vec<FieldError>,
) {
    let window = limits.tenant_replay_window;
    if let Some(from) = from
        && to
            .unwrap_or_else(SystemTime::now)
            .duration_since(from)
            .is_ok_and(|w| w > window)
    {
        errors.push(FieldError::new(
            "from",
            format!(
                "a tenant's replay covers at most {} (api.tenant_replay_window): from must be \
                 within that of to (or of now)",
                fmt_duration(window)
            ),
        ));
    }
    let max = limits.tenant_replay_rate;
    if rate.is_some_and(|r| r.per_second() > max.per_second()) {
        errors.push(FieldError::new(
            "rate",
            format!("a tenant's replay goes at most at {max} (api.tenant_replay_rate)"),
        ));
    }
}

/// Starts a replay: the archive's events accepted in the window, filtered, published again
/// through the ingress with their original ids (receivers deduplicate). Runs in the background;
/// the answer (202) is the job, to be followed with `GET /v1/replays/{id}`.
#[utoipa::path(
    post, path = "/v1/replays", tag = "replays",
    request_body = CreateReplay,
    responses(
        (status = 202, description = "Started", body = ReplayJob),
        MalformedJson,
        Unauthorized,
        (status = 404, description = "Another tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "As many replays as allowed are running (in the process, or of this tenant)", body = Problem, content_type = "application/problem+json"),
        TooLarge,
        (status = 422, description = "Invalid input, or a tenant's window or rate beyond its bounds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "No broker connection", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CreateReplay = json(body, None, state.max_body)?;
    // A tenant's replay reads its own tenant's events only: naming another tenant's
    // subscription finds nothing, as naming an unknown one does, and is answered alike.
    let options = options(&req, &scope, &state.limits)?;
    let (publisher, broker) = state.publisher().await?;
    let id = options.id.clone().unwrap_or_default();
    let (tx, rx) = watch::channel(ReplayReport {
        id: id.clone(),
        ..ReplayReport::default()
    });
    let view = ReplayJob {
        id: id.clone(),
        state: "running".into(),
        from: humantime::format_rfc3339_seconds(options.from).to_string(),
        to: options
            .to
            .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
        tenant: options.filter.tenant.clone(),
        subscription: req.subscription.clone(),
        event_type: req.event_type.clone(),
        event: req.event.clone(),
        only_undelivered: req.only_undelivered,
        rate: req
            .rate
            .clone()
            .or_else(|| options.rate.map(|r| r.to_string())),
        dry_run: req.dry_run,
        read: 0,
        matched: 0,
        delivered_already: 0,
        published: 0,
        error: None,
        started_at: now_rfc3339(),
        finished_at: None,
    };
    let cancel = state.stop.child_token();
    let (ended_tx, ended_rx) = watch::channel(false);
    {
        let mut jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
        jobs.admit(&state.limits, scope.tenant())?;
        jobs.jobs.insert(
            id.clone(),
            Job {
                view: view.clone(),
                report: rx,
                started_by: scope.tenant().map(str::to_owned),
                cancel: cancel.clone(),
                ended: ended_rx,
            },
        );
    }
    info!(replay = %id, tenant = ?options.filter.tenant, dry_run = options.dry_run, "Replay started");
    let broker = broker.clone();
    let stop = state.stop.clone();
    // The replay's future is not `Send` (its stream reader's callback borrows across awaits):
    // it runs on a blocking thread of its own, driven by this runtime.
    let runtime = tokio::runtime::Handle::current();
    let task = tokio::task::spawn_blocking(move || {
        runtime.block_on(async move {
        let result = async {
            let conn = Connection::connect(
                broker.amqp_url.expose(),
                ConnectionProperties::default().with_connection_name("hookrelay api replay".into()),
            )
            .await
            .map_err(|e| format!("cannot connect to the broker: {e}"))?;
            let report = crate::ops::replay::replay(
                &conn,
                &publisher,
                &broker.ladder,
                &options,
                None,
                Some(&tx),
            )
            .await;
            let _ = conn.close(200, "replayed".into()).await;
            report.map_err(|e| e.to_string())
        };
        tokio::select! {
            r = result => match r {
                Ok(report) => {
                    info!(replay = %report.id, read = report.read, matched = report.matched, published = report.published, "Replay finished");
                    Ended::Finished
                }
                Err(e) => Ended::Failed(e),
            },
            () = cancel.cancelled() => if stop.is_cancelled() {
                Ended::Failed("stopped: the API shut down (start it again; receivers deduplicate)".into())
            } else {
                info!(replay = %options.id.as_deref().unwrap_or(""), "Replay cancelled");
                Ended::Cancelled
            },
        }
    })
    });
    let jobs = Arc::clone(&state.replays);
    state
        .background
        .spawn(supervise(jobs, id.clone(), ended_tx, task));
    let mut response = (StatusCode::ACCEPTED, axum::Json(view)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/replays/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// A replay job: its progress while it runs, its counts and outcome once done.
#[utoipa::path(
    get, path = "/v1/replays/{id}", tag = "replays",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = ReplayJob),
        Unauthorized,
        NoSuchReplay,
    )
)]
pub async fn read(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<ReplayJob>, ApiError> {
    let jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
    jobs.jobs
        .get(&id)
        .filter(|job| job.seen_by(&scope))
        .map(|job| axum::Json(job.current()))
        .ok_or(ApiError::Absent("replay"))
}

/// Cancels a running replay: it stops before its next publish (what it published stays
/// published) and gives back its slot; the answer is the job once it has stopped (within
/// seconds), `cancelled`. Cancelling a cancelled replay answers the same.
#[utoipa::path(
    post, path = "/v1/replays/{id}/cancel", tag = "replays",
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "Cancelled", body = ReplayJob),
        Unauthorized,
        NoSuchReplay,
        (status = 409, description = "The replay has finished or failed", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<ReplayJob>, ApiError> {
    let mut ended = {
        let jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
        let job = jobs
            .jobs
            .get(&id)
            .filter(|job| job.seen_by(&scope))
            .ok_or(ApiError::Absent("replay"))?;
        match job.view.state.as_str() {
            "running" => {
                job.cancel.cancel();
                job.ended.clone()
            }
            "cancelled" => return Ok(axum::Json(job.current())),
            other => {
                return Err(ApiError::Conflict(format!(
                    "the replay has ended ({other}): there is nothing to cancel"
                )));
            }
        }
    };
    // The job stops at its next await; past the wait the answer still says `running`, and a
    // GET says `cancelled` once it has stopped.
    let _ = tokio::time::timeout(CANCEL_WAIT, ended.wait_for(|ended| *ended)).await;
    let jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
    jobs.jobs
        .get(&id)
        .map(|job| axum::Json(job.current()))
        .ok_or(ApiError::Absent("replay"))
}

/// The jobs `scope` may see, running ones first, newest first within each (for the console;
/// at most [`KEPT`] ended ones are kept).
pub fn list(state: &ApiState, scope: &Scope) -> Vec<ReplayJob> {
    let jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
    let mut seen: Vec<ReplayJob> = jobs
        .jobs
        .values()
        .filter(|job| job.seen_by(scope))
        .map(Job::current)
        .collect();
    seen.sort_by(|a, b| {
        (b.state == "running", &b.started_at).cmp(&(a.state == "running", &a.started_at))
    });
    seen
}

/// The jobs' table, shared by the handlers and the jobs' supervisors.
pub type SharedJobs = Mutex<Jobs>;

#[cfg(test)]
mod tests {
    use super::*;

    fn running(jobs: &Arc<SharedJobs>, id: &str, started_by: Option<&str>) -> watch::Sender<bool> {
        let (_, report) = watch::channel(ReplayReport::default());
        let (ended_tx, ended) = watch::channel(false);
        let view = ReplayJob {
            id: id.into(),
            state: "running".into(),
            from: String::new(),
            to: None,
            tenant: started_by.map(str::to_owned),
            subscription: None,
            event_type: None,
            event: None,
            only_undelivered: false,
            rate: None,
            dry_run: true,
            read: 0,
            matched: 0,
            delivered_already: 0,
            published: 0,
            error: None,
            started_at: String::new(),
            finished_at: None,
        };
        let job = Job {
            view,
            report,
            started_by: started_by.map(str::to_owned),
            cancel: CancellationToken::new(),
            ended,
        };
        jobs.lock().unwrap().jobs.insert(id.into(), job);
        ended_tx
    }

    fn state_of(jobs: &Arc<SharedJobs>, id: &str) -> (String, Option<String>) {
        let jobs = jobs.lock().unwrap();
        let view = &jobs.jobs[id].view;
        (view.state.clone(), view.error.clone())
    }

    #[tokio::test]
    async fn a_job_whose_task_panics_ends_failed_and_gives_back_its_slot() {
        let jobs = Arc::new(SharedJobs::default());
        let limits = Limits {
            replays_running: 1,
            ..Limits::default()
        };
        let ended = running(&jobs, "rpl_panics", None);
        let mut seen = ended.subscribe();
        assert!(jobs.lock().unwrap().admit(&limits, None).is_err());
        let task = tokio::task::spawn_blocking(|| -> Ended { panic!("a pace of no duration") });
        supervise(Arc::clone(&jobs), "rpl_panics".into(), ended, task).await;
        let (state, error) = state_of(&jobs, "rpl_panics");
        assert_eq!(state, "failed");
        let error = error.unwrap();
        assert!(error.contains("a pace of no duration"), "{error}");
        assert!(*seen.borrow_and_update());
        assert!(jobs.lock().unwrap().admit(&limits, None).is_ok());
    }

    #[tokio::test]
    async fn a_job_whose_supervisor_is_dropped_ends_failed_all_the_same() {
        let jobs = Arc::new(SharedJobs::default());
        let ended = running(&jobs, "rpl_dropped", None);
        let task = tokio::spawn(std::future::pending::<Ended>());
        let supervisor = tokio::spawn(supervise(
            Arc::clone(&jobs),
            "rpl_dropped".into(),
            ended,
            task,
        ));
        supervisor.abort();
        let _ = supervisor.await;
        assert_eq!(state_of(&jobs, "rpl_dropped").0, "failed");
        assert_eq!(jobs.lock().unwrap().running(), 0);
    }

    #[test]
    fn replays_are_admitted_per_process_and_per_tenant() {
        let jobs = Arc::new(SharedJobs::default());
        let limits = Limits {
            replays_running: 3,
            replays_per_tenant: 1,
            ..Limits::default()
        };
        let _a = running(&jobs, "rpl_a", Some("acme"));
        let admit = |tenant| jobs.lock().unwrap().admit(&limits, tenant).is_ok();
        assert!(!admit(Some("acme")));
        assert!(admit(Some("globex")));
        assert!(admit(None));
        let _b = running(&jobs, "rpl_b", None);
        let _c = running(&jobs, "rpl_c", None);
        assert!(!admit(Some("globex")) && !admit(None));
        jobs.lock().unwrap().finish("rpl_a", Ended::Cancelled);
        assert!(admit(Some("acme")));
        assert_eq!(state_of(&jobs, "rpl_a").0, "cancelled");
        // Ended once: a later word does not change how.
        jobs.lock()
            .unwrap()
            .finish("rpl_a", Ended::Failed("late".into()));
        assert_eq!(state_of(&jobs, "rpl_a"), ("cancelled".into(), None));
    }
}
