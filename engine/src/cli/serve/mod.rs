//! `flashsale serve`: the HTTP service in front of a shop. Owns the lifecycle:
//! the caller binds, [`run`] serves until the shutdown future resolves (stop
//! accepting, finish in-flight requests); then the command drains the order
//! writer, so every purchase answered 200 is in PostgreSQL, and exits 0.
//! Concurrency is capped with a semaphore; `/metrics` is served here.

mod api;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use deadpool_postgres::Pool;
use flashsale::{Config, Engine};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use flashsale::ratelimit::RateLimiter;

/// HTTP requests answered, by `route` and `status`.
const HTTP_REQUESTS: &str = "flashsale_http_requests_total";
/// HTTP request latency by `route`, seconds.
const HTTP_SECONDS: &str = "flashsale_http_request_duration_seconds";

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    engine: Engine,
    pool: Pool,
    admin_token: Option<String>,
    limiter: Arc<RateLimiter>,
    prometheus: PrometheusHandle,
    in_flight: Arc<Semaphore>,
}

/// Flags of `serve` (override the config).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (default: server.listen).
    #[arg(long)]
    pub listen: Option<String>,
    /// Bearer token for admin routes (default: server.admin_token).
    #[arg(long, env = "FLASHSALE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Do not run the order writer in this process (run `flashsale orders run`).
    #[arg(long)]
    pub no_order_writer: bool,
}

/// Installs the Prometheus recorder (histograms as real buckets so
/// percentiles can be computed across instances).
fn install_metrics() -> Result<PrometheusHandle> {
    let buckets = [
        0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ];
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()
        .context("installing the Prometheus recorder")
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/sales", post(api::create_sale))
        .route("/v1/sales/{sku}", get(api::sale_status))
        .route("/v1/sales/{sku}/restock", post(api::restock))
        .route("/v1/sales/{sku}/close", post(api::close))
        .route("/v1/sales/{sku}/purchase", post(api::purchase))
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
        .fallback(api::not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Caps requests in flight and records per-route metrics.
async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let started = Instant::now();
    // A closed semaphore never happens (we never close it); serve anyway.
    let _permit = state.in_flight.acquire().await.ok();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::counter!(HTTP_REQUESTS, "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!(HTTP_SECONDS, "route" => route).record(started.elapsed().as_secs_f64());
    resp
}

/// Serves on `listener` until `shutdown` resolves, then finishes the requests
/// in flight and returns.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// The `serve` command.
pub async fn command(
    mut config: Config,
    args: ServeArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    if let Some(l) = args.listen {
        config.server.listen = l;
    }
    if let Some(t) = args.admin_token {
        config.server.admin_token = Some(t);
    }
    if args.no_order_writer {
        config.server.order_writer = false;
    }
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let prometheus = install_metrics()?;
    let server = config.server.clone();
    let pool = flashsale::db::pool(&config.postgres_url, 8)?;
    let engine = Engine::connect(config).await?;
    if let Err(e) = flashsale::db::migrate(&pool).await {
        tracing::warn!(error = %e, "PostgreSQL not ready at start; /readyz says so until it is");
    }

    let writer = if server.order_writer {
        Some(
            engine
                .spawn_order_writer(pool.clone(), flashsale::WriterConfig::default())
                .await?,
        )
    } else {
        None
    };
    let background = spawn_background(
        engine.clone(),
        pool.clone(),
        prometheus.clone(),
        server.reconcile_every,
    );

    let state = AppState {
        engine,
        pool,
        admin_token: server.admin_token.clone(),
        limiter: Arc::new(RateLimiter::new(
            server.per_user_rps,
            server.per_user_burst,
            server.global_rps,
            server.global_burst,
        )),
        prometheus,
        in_flight: Arc::new(Semaphore::new(server.max_in_flight)),
    };
    let listener = TcpListener::bind(&server.listen)
        .await
        .with_context(|| format!("binding {}", server.listen))?;
    eprintln!("flashsale serving on http://{}", listener.local_addr()?);
    run(listener, state, shutdown).await?;

    background.abort();
    if let Some(w) = writer {
        let report = w.drain(Duration::from_secs(30)).await?;
        eprintln!("order writer drained: {} written", report.written);
    }
    Ok(())
}

/// Prometheus upkeep and the periodic ledger check (which exports the
/// conservation and stock gauges).
fn spawn_background(
    engine: Engine,
    pool: Pool,
    prometheus: PrometheusHandle,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            prometheus.run_upkeep();
            if let Err(e) = flashsale::ledger::reconcile(&engine, &pool, &[]).await {
                tracing::warn!(error = %e, "periodic reconcile failed");
            }
        }
    })
}
