//! `flashsale serve`: the HTTP service in front of a shop. Owns the lifecycle:
//! the caller binds, [`run`] serves until the shutdown future resolves (stop
//! accepting, give requests in flight a bounded grace); then the command
//! drains the order writer, so every purchase answered 200 is in
//! PostgreSQL, and exits 0. It must never let a client hold it: headers and
//! bodies are read under deadlines, bodies are capped, every request has a
//! deadline, connections are capped, and the health, readiness and metrics
//! routes never wait behind purchases. Every error answer is JSON.

mod answers;
mod api;
mod openapi;
mod queue;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use deadpool_postgres::Pool;
use flashsale::{Engine, Settings};
use http_body_util::BodyExt;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::process::ExitCode;
use tokio::net::TcpListener;

use answers::ApiError;
use tokio::sync::Semaphore;

use flashsale::ratelimit::RateLimiter;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    engine: Engine,
    pool: Pool,
    admin_token: Option<String>,
    limiter: Arc<RateLimiter>,
    prometheus: PrometheusHandle,
    in_flight: Arc<Semaphore>,
    /// Waiting-room event streams open at once: a stream holds a
    /// connection for minutes, so they may take at most a quarter of
    /// `max_connections` and buyers keep the rest.
    streams: Arc<Semaphore>,
    limits: Limits,
}

/// The deadlines and caps of the HTTP layer (from `ServerConfig`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    request_timeout: Duration,
    shutdown_grace: Duration,
    write_timeout: Duration,
    max_body_bytes: usize,
    max_header_bytes: usize,
    max_connections: usize,
}

impl Limits {
    fn from_config(s: &flashsale::ServerConfig) -> Self {
        Limits {
            header_read_timeout: s.header_read_timeout,
            body_read_timeout: s.body_read_timeout,
            request_timeout: s.request_timeout,
            shutdown_grace: s.shutdown_grace,
            write_timeout: s.write_timeout,
            max_body_bytes: s.max_body_bytes,
            max_header_bytes: s.max_header_bytes,
            max_connections: s.max_connections,
        }
    }
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

/// The probes and the scrape: on the public router unless they have a
/// listener of their own (`server.metrics_listen`), where they are all
/// there is.
fn probe_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
        .fallback(api::not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

fn router(state: AppState, probes_here: bool) -> Router {
    // Every route here needs the admin token; the layer checks it before the
    // handler runs (route_layer: an unknown path is still 404, not 401).
    let admin = Router::new()
        .route("/v1/sales", post(api::create_sale))
        .route("/v1/sales/{sku}/restock", post(api::restock))
        .route("/v1/sales/{sku}/close", post(api::close))
        .route("/v1/orders/{order_id}/pay", post(api::pay))
        .route("/v1/orders/{order_id}/cancel", post(api::cancel))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            api::require_admin,
        ));
    let public = Router::new()
        .merge(admin)
        .route("/v1/sales/{sku}", get(api::sale_status))
        .route("/v1/sales/{sku}/purchase", post(api::purchase))
        .route("/v1/sales/{sku}/queue", post(queue::join))
        .route("/v1/queue/{ticket}", get(queue::status))
        .route("/v1/orders/{order_id}", get(api::order))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/healthz", get(api::healthz));
    let public = if probes_here {
        public
            .route("/readyz", get(api::readyz))
            .route("/metrics", get(api::metrics))
    } else {
        public
    };
    public
        .fallback(api::not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

async fn method_not_allowed() -> ApiError {
    ApiError::for_status(StatusCode::METHOD_NOT_ALLOWED)
}

/// Routes that answer without waiting for a slot: probes and scrapes must
/// work while purchases queue.
fn is_probe(route: &str) -> bool {
    matches!(route, "/healthz" | "/readyz" | "/metrics")
}

/// Every request: the body read under its deadline and cap *before* a slot
/// is taken (a slow body never holds one), then a slot (not for probes),
/// then the handler under the request deadline; any error answer not yet
/// JSON is made JSON; per-route metrics.
async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let started = Instant::now();
    let resp = match read_body(req, &state.limits).await {
        Err(status) => ApiError::for_status(status).into_response(),
        Ok(req) => {
            // The deadline covers the wait for a slot as well as the handler.
            let probe = is_probe(&route);
            let served = async {
                // A closed semaphore never happens (we never close it).
                let _permit = if probe {
                    None
                } else {
                    state.in_flight.acquire().await.ok()
                };
                next.run(req).await
            };
            match tokio::time::timeout(state.limits.request_timeout, served).await {
                Ok(resp) => resp,
                Err(_) => ApiError::for_status(StatusCode::SERVICE_UNAVAILABLE).into_response(),
            }
        }
    };
    let resp = json_errors(resp);
    let status = resp.status().as_u16().to_string();
    metrics::counter!(flashsale::metrics::HTTP_REQUESTS, "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!(flashsale::metrics::HTTP_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}

/// Reads the whole body within `body_read_timeout` and `max_body_bytes`:
/// 408 when the client is too slow, 413 when it sends too much.
async fn read_body(req: Request, limits: &Limits) -> Result<Request, StatusCode> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, limits.max_body_bytes);
    let bytes = match tokio::time::timeout(limits.body_read_timeout, limited.collect()).await {
        Err(_) => return Err(StatusCode::REQUEST_TIMEOUT),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(StatusCode::PAYLOAD_TOO_LARGE)
        }
        Ok(Err(_)) => return Err(StatusCode::BAD_REQUEST),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// An error answer whose body is not JSON (the router's own, or an
/// extractor's plain-text rejection) becomes `{"error","message"}`.
fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if (status.is_client_error() || status.is_server_error()) && !is_json {
        return ApiError::for_status(status).into_response();
    }
    resp
}

/// Serves on `listener` until `shutdown` resolves; then stops accepting,
/// gives the requests in flight `shutdown_grace`, and returns (connections
/// still open after that are dropped).
///
/// Not `axum::serve`: it has no header-read deadline, so a client sending
/// headers a byte at a time could hold a connection for ever. hyper's own
/// connection builder has one.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s?,
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: pause, go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let io = WriteDeadline::new(stream, limits.write_timeout);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes)
            .serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(grace = ?limits.shutdown_grace, "requests still in flight after the shutdown grace; closing");
        }
    }
    Ok(())
}

/// A connection whose writes fail once one has made no progress for
/// `timeout`: hyper has a deadline for reading a request's head but none for
/// a client that stops reading answers (pipelining requests and never
/// reading fills the socket, and the connection would be held for ever).
struct WriteDeadline {
    inner: tokio::net::TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WriteDeadline {
    fn new(inner: tokio::net::TcpStream, timeout: Duration) -> Self {
        WriteDeadline {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// A write that could not progress arms the deadline (once per stall);
    /// one that did disarms it. Past the deadline the write fails.
    fn check<T>(
        &mut self,
        cx: &mut TaskContext<'_>,
        r: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => {
                let timeout = self.timeout;
                let sleep = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client stopped reading",
                    )));
                }
                Poll::Pending
            }
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl tokio::io::AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `max_connections`, lowered (with a warning) to what the process's open
/// file limit leaves after a reserve for Redis, PostgreSQL and the rest:
/// past that limit `accept` fails, and so does every reconnect.
fn connections_within_file_limit(wanted: usize) -> usize {
    const RESERVE: u64 = 256;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid resource and a pointer to a live struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return wanted;
    }
    let need = wanted as u64 + RESERVE;
    if lim.rlim_cur < need && lim.rlim_max > lim.rlim_cur {
        let raised = libc::rlimit {
            rlim_cur: need.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit with a valid resource and a pointer to a live struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = raised.rlim_cur;
        }
    }
    let fit = usize::try_from(lim.rlim_cur.saturating_sub(RESERVE).max(1)).unwrap_or(wanted);
    if fit < wanted {
        tracing::warn!(
            wanted,
            fit,
            "server.max_connections lowered to fit the open file limit"
        );
        eprintln!(
            "flashsale serve: max_connections lowered from {wanted} to {fit} to fit the open file limit (ulimit -n)"
        );
        return fit;
    }
    wanted
}

/// The `serve` command.
pub async fn command(
    settings: Settings,
    args: ServeArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<ExitCode> {
    let Settings {
        engine: config,
        mut server,
    } = settings;
    if let Some(l) = args.listen {
        server.listen = l;
    }
    if let Some(t) = args.admin_token {
        server.admin_token = Some(t);
    }
    // One rule with `config check`: unset, empty or blank turns admin off.
    server.admin_token = server.admin_token().map(str::to_owned);
    if args.no_order_writer {
        server.order_writer = false;
    }
    server
        .validate()
        .map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let prometheus = install_metrics()?;
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
    // Expires due holds of every sale with holds; safe beside other
    // processes' sweepers (each expiry is a compare-and-set).
    let hold_sweeper = engine.spawn_hold_sweeper();
    // Waiting rooms: admission rounds every 100 ms (any number of serve
    // processes may run them; the gate serialises the rounds).
    let admitter = engine.spawn_room_admitter(Duration::from_millis(100));
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
        streams: Arc::new(Semaphore::new(
            (connections_within_file_limit(server.max_connections) / 4).max(1),
        )),
        limits: Limits {
            max_connections: connections_within_file_limit(server.max_connections),
            ..Limits::from_config(&server)
        },
    };
    let listener = TcpListener::bind(&server.listen)
        .await
        .with_context(|| format!("binding {}", server.listen))?;
    eprintln!("flashsale serving on http://{}", listener.local_addr()?);
    let limits = state.limits;
    let shutdown = futures_util::FutureExt::shared(Box::pin(shutdown));
    let probes = match &server.metrics_listen {
        Some(addr) => {
            let probe_listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr} (server.metrics_listen)"))?;
            eprintln!(
                "flashsale metrics and probes on http://{}",
                probe_listener.local_addr()?
            );
            // Few connections: a scraper and a prober or two, never enough
            // to matter beside the public listener's.
            let probe_limits = Limits {
                max_connections: 64,
                ..limits
            };
            Some(tokio::spawn(run(
                probe_listener,
                probe_router(state.clone()),
                probe_limits,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    run(listener, router(state, probes.is_none()), limits, shutdown).await?;
    if let Some(p) = probes {
        p.await??;
    }

    background.abort();
    hold_sweeper.abort();
    admitter.abort();
    if let Some(w) = writer {
        let report = w.drain(Duration::from_secs(30)).await?;
        eprintln!("order writer drained: {} written", report.written);
    }
    Ok(ExitCode::SUCCESS)
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
