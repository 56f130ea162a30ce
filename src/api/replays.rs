//! The handlers of `/v1/replays`: a replay of archived events (what `hookrelay replay` does)
//! started as a job of this API process, and its progress. A tenant's token replays only its
//! own tenant's events. At most [`MAX_RUNNING`] run at once; the last [`KEPT`] are remembered
//! until the API restarts (a job does not survive a restart: start it again; receivers
//! deduplicate by the original ids).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lapin::{Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};
use utoipa::ToSchema;

use crate::contract::envelope::{check_id, check_tenant};
use crate::delivery::subscriptions::EventFilter;
use crate::ops::replay::{ReplayFilter, ReplayOptions, ReplayReport, new_id};
use crate::units::{Rate, now_rfc3339, parse_when};

use super::ApiState;
use super::auth::Scope;
use super::problem::{ApiError, FieldError, Problem};
use super::subscriptions::json;

/// Replays running at once, at most; one more is answered 409.
pub const MAX_RUNNING: usize = 4;
/// Finished replays remembered for `GET`.
pub const KEPT: usize = 100;

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
    /// `running`, `finished` or `failed`.
    pub state: String,
    pub from: String,
    pub to: Option<String>,
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
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
}

impl Jobs {
    fn running(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.view.state == "running")
            .count()
    }

    fn finish(&mut self, id: &str, error: Option<String>) {
        if let Some(job) = self.jobs.get_mut(id) {
            job.view.state = if error.is_some() {
                "failed"
            } else {
                "finished"
            }
            .into();
            job.view.error = error;
            job.view.finished_at = Some(now_rfc3339());
        }
        self.finished.push_back(id.to_owned());
        while self.finished.len() > KEPT {
            if let Some(old) = self.finished.pop_front() {
                self.jobs.remove(&old);
            }
        }
    }
}

/// The request checked: the replay's options, every problem named by its field.
fn options(req: &CreateReplay, scope: &Scope) -> Result<ReplayOptions, ApiError> {
    let mut errors = Vec::new();
    let from = parse_when(&req.from)
        .map_err(|e| errors.push(FieldError::new("from", e)))
        .ok();
    let to = match &req.to {
        None => None,
        Some(text) => parse_when(text)
            .map_err(|e| errors.push(FieldError::new("to", e)))
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
    let event_type = match &req.event_type {
        None => None,
        Some(t) => EventFilter::parse(t)
            .map_err(|e| errors.push(FieldError::new("type", e.to_string())))
            .ok(),
    };
    let rate = req
        .rate
        .as_deref()
        .unwrap_or(crate::ops::replay::DEFAULT_RATE)
        .parse::<Rate>()
        .map_err(|e| errors.push(FieldError::new("rate", e)))
        .ok();
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
        },
        only_undelivered: req.only_undelivered,
        rate,
        dry_run: req.dry_run,
    })
}

/// Starts a replay: the archive's events accepted in the window, filtered, published again
/// through the ingress with their original ids (receivers deduplicate). Runs in the background;
/// the answer (202) is the job, to be followed with `GET /v1/replays/{id}`.
#[utoipa::path(
    post, path = "/v1/replays", tag = "replays",
    request_body = CreateReplay,
    responses(
        (status = 202, description = "Started", body = ReplayJob),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Another tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "As many replays as allowed are running", body = Problem, content_type = "application/problem+json"),
        (status = 413, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid input", body = Problem, content_type = "application/problem+json"),
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
    let options = options(&req, &scope)?;
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
        only_undelivered: req.only_undelivered,
        rate: Some(
            req.rate
                .clone()
                .unwrap_or_else(|| crate::ops::replay::DEFAULT_RATE.to_owned()),
        ),
        dry_run: req.dry_run,
        read: 0,
        matched: 0,
        delivered_already: 0,
        published: 0,
        error: None,
        started_at: now_rfc3339(),
        finished_at: None,
    };
    {
        let mut jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.running() >= MAX_RUNNING {
            return Err(ApiError::Conflict(format!(
                "{MAX_RUNNING} replays are running, the most at once; wait for one to finish \
                 (GET /v1/replays/{{id}})"
            )));
        }
        jobs.jobs.insert(
            id.clone(),
            Job {
                view: view.clone(),
                report: rx,
            },
        );
    }
    info!(replay = %id, tenant = ?options.filter.tenant, dry_run = options.dry_run, "Replay started");
    let job_state = state.clone();
    let broker = broker.clone();
    let stop = state.stop.clone();
    // The replay's future is not `Send` (its stream reader's callback borrows across awaits):
    // it runs on a blocking thread of its own, driven by this runtime.
    let runtime = tokio::runtime::Handle::current();
    state.background.spawn_blocking(move || runtime.block_on(async move {
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
        let result = tokio::select! {
            r = result => r,
            () = stop.cancelled() => Err(
                "stopped: the API shut down (start it again; receivers deduplicate)".to_owned()
            ),
        };
        let error = match result {
            Ok(report) => {
                info!(replay = %report.id, read = report.read, matched = report.matched, published = report.published, "Replay finished");
                None
            }
            Err(e) => {
                warn!(replay = %options.id.as_deref().unwrap_or(""), error = %e, "Replay failed");
                Some(e)
            }
        };
        let mut jobs = job_state.replays.lock().unwrap_or_else(|p| p.into_inner());
        jobs.finish(options.id.as_deref().unwrap_or(""), error);
    }));
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
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such replay (this process's last 100), or another tenant's", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<ReplayJob>, ApiError> {
    let jobs = state.replays.lock().unwrap_or_else(|p| p.into_inner());
    let job = jobs.jobs.get(&id).ok_or(ApiError::Absent("replay"))?;
    if let Scope::Tenant(own) = &scope
        && job.view.tenant.as_deref() != Some(own.as_str())
    {
        return Err(ApiError::Absent("replay"));
    }
    Ok(axum::Json(job.current()))
}

/// The jobs' table, shared by the handlers.
pub type SharedJobs = Mutex<Jobs>;
