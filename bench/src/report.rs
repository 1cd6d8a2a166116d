//! Results as data: the table on stdout, the JSON file with every figure and
//! the machine facts, a Markdown summary, and an SVG plot of throughput and
//! latency percentiles per strategy. No measuring here.

use std::fmt::Write as _;

use serde::Serialize;

use crate::lockbench::LockResult;

/// One strategy in one scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunResult {
    /// `hot1`, `hotB`, `many`.
    pub scenario: String,
    /// `anchor`, `engine`, `engine@80%`, `lock`, `naive`.
    pub strategy: String,
    /// Operations completed (requests answered).
    pub ops: u64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Confirmed purchases (lock pairs) per second: for inventory rows,
    /// over the span the stock clock saw on Redis (first unit taken to
    /// stock at 0), the same for anchor and engine; across repetitions,
    /// the median.
    pub throughput: f64,
    /// Throughput of each repetition, in the order they ran.
    pub repetitions: Vec<f64>,
    /// Lowest and highest of `repetitions`.
    pub throughput_min: f64,
    /// See `throughput_min`.
    pub throughput_max: f64,
    /// Answers of any kind (sold out included) per second of wall time.
    pub answers_per_s: f64,
    /// Units put on sale for the run (ops / 2, so oversell shows).
    pub stock: u64,
    /// Master CPU time per answered request, µs: the `INFO cpu` deltas
    /// (system + user) of every master, over the requests answered.
    pub redis_us_per_op: Option<f64>,
    /// Master CPU time per confirmed purchase, µs: every master's CPU from
    /// the row's start to the moment the stock keys read 0 (the stock
    /// clock, `driver/stock_clock.rs`), over the purchases confirmed
    /// (orders queued, for the anchor); the sold-out answers after the
    /// zero are left out (whole-row CPU, and the note says so, when the
    /// stock never ran out). It is the figure that sizes a cluster.
    #[serde(default)]
    pub master_us_per_confirmed: Option<f64>,
    /// This process's CPU time (getrusage: user + system) per confirmed
    /// purchase, µs: the engine and the load generator driving it, which
    /// share the process (engine rows only).
    #[serde(default)]
    pub client_us_per_confirmed: Option<f64>,
    /// Requests per second the masters could serve with one core each: the
    /// sum over masters of their requests per second of master time (a
    /// master's requests: its share of the script calls). On 2 shared cores
    /// this is a projection, not a measurement.
    pub projected_ceiling: Option<f64>,
    /// Purchases per script call the engine sent (natural batching), the
    /// median and 99th percentile over the row's batches; None for rows
    /// that are not the engine's.
    pub batch_p50: Option<f64>,
    /// See `batch_p50`.
    pub batch_p99: Option<f64>,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms (redis-benchmark's CSV does not report it).
    pub p999_ms: Option<f64>,
    /// Units confirmed.
    pub confirmed: u64,
    /// Units sold beyond the stock (must be 0 except for `naive`).
    pub oversold: u64,
    /// Failed operations.
    pub errors: u64,
    /// Throughput / the scenario's anchor throughput.
    pub ratio_to_anchor: Option<f64>,
    /// The `engine hold` row: p99 of the lag from a hold's deadline to its
    /// units back on sale, ms.
    pub expiry_lag_p99_ms: Option<f64>,
    /// AOF rewrites and RDB saves any node of the cluster made while the
    /// row ran (each row starts with none under way and none due, see
    /// `settle`); None for rows that do not read the servers.
    pub persistence_forks: Option<u64>,
    /// The `orders` rows: the engine's purchases per second while it sold
    /// the row's stock (with the writers running for `orders`, alone for
    /// `orders drain`).
    pub engine_per_s: Option<f64>,
    /// `orders drain` only: CPU µs of every PostgreSQL process (from
    /// /proc) per order written, over the drain.
    #[serde(default)]
    pub db_us_per_order: Option<f64>,
    /// Timed by the stock clock (`driver/stock_clock.rs`): the stock keys,
    /// first unit taken to the last. Throughputs are compared only
    /// between rows timed so.
    #[serde(default)]
    pub stock_clock: bool,
    /// What to know when reading the row.
    pub note: String,
}

impl RunResult {
    /// A row of one repetition whose rate is `throughput`: the rate, its
    /// only repetition, and the range of one.
    pub fn with_rate(mut self, throughput: f64) -> RunResult {
        self.throughput = throughput;
        self.repetitions = vec![throughput];
        self.throughput_min = throughput;
        self.throughput_max = throughput;
        self
    }
}

/// Facts of the machine and cluster the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical cores.
    pub cores: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu: String,
    /// Redis server version.
    pub redis_version: String,
    /// Masters in the cluster.
    pub masters: usize,
    /// Replicas in the cluster.
    pub replicas: usize,
}

/// One pass/miss line against the harness's targets.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value.
    pub measured: Option<f64>,
    /// The goal, as text.
    pub goal: String,
    /// Whether it was met (None when not measured in this run).
    pub met: Option<bool>,
    /// The figure in each repetition; `measured` is their worst for a tail,
    /// else their median.
    pub per_repetition: Vec<f64>,
}

/// Everything one invocation measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// When (Unix seconds).
    pub generated_at: u64,
    /// The command line.
    pub command: String,
    /// Machine facts.
    pub machine: Machine,
    /// Strategy runs.
    pub results: Vec<RunResult>,
    /// Lock benchmark.
    pub lock_results: Vec<LockResult>,
    /// Targets.
    pub targets: Vec<Target>,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// The tables (strategies, locks, targets) as Markdown.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let m = &r.machine;
    let _ = writeln!(
        s,
        "Machine: {} cores ({}), Redis {}, cluster {} masters + {} replicas\n",
        m.cores, m.cpu, m.redis_version, m.masters, m.replicas
    );
    let _ = writeln!(s, "| scenario | strategy | ops | stock | conc | confirmed/s (min-max) | answers/s | master µs/op | master µs/confirmed | client µs/confirmed | 1-core ceiling | batch p50/p99 | p50 ms | p99 ms | p999 ms | oversold | errors | x anchor | note |");
    let _ = writeln!(
        s,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for x in &r.results {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.0} ({:.0}-{:.0}) | {:.0} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {} | {} | {} | {} | {} |",
            x.scenario,
            x.strategy,
            x.ops,
            x.stock,
            x.concurrency,
            x.throughput,
            x.throughput_min,
            x.throughput_max,
            x.answers_per_s,
            opt(x.redis_us_per_op, 1),
            opt(x.master_us_per_confirmed, 1),
            opt(x.client_us_per_confirmed, 1),
            opt(x.projected_ceiling, 0),
            match (x.batch_p50, x.batch_p99) {
                (Some(a), Some(b)) => format!("{a:.0}/{b:.0}"),
                _ => "-".into(),
            },
            x.p50_ms,
            x.p99_ms,
            opt(x.p999_ms, 3),
            x.oversold,
            x.errors,
            opt(x.ratio_to_anchor, 2),
            x.note
        );
    }
    if !r.lock_results.is_empty() {
        let _ = writeln!(s, "\n| lock | nodes | tasks | pairs | pairs/s | hand-off p50 ms | hand-off p99 ms | longest wait ms | errors | overlaps |");
        let _ = writeln!(
            s,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for l in &r.lock_results {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                l.implementation,
                l.nodes,
                l.tasks,
                l.pairs,
                l.pairs_per_second,
                opt(l.handoff_p50_ms, 2),
                opt(l.handoff_p99_ms, 2),
                opt(l.longest_wait_ms, 1),
                l.errors,
                l.overlaps
            );
        }
    }
    let _ = writeln!(
        s,
        "\nTargets: a tail (p99, longest wait) on its worst repetition, any other figure on the median over repetitions; each figure taken within one repetition."
    );
    let _ = writeln!(s, "\n| target | measured | goal | met |");
    let _ = writeln!(s, "| --- | ---: | --- | --- |");
    for t in &r.targets {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not run",
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            t.name,
            opt(t.measured, 2),
            t.goal,
            met
        );
    }
    s
}

/// An SVG with two bar charts: throughput, and p50/p99/p999 latency.
pub fn svg(r: &Report) -> String {
    let rows: Vec<&RunResult> = r.results.iter().collect();
    let w = 980.0;
    let bar_h = 18.0;
    let left = 220.0;
    let chart_w = w - left - 80.0;
    let h1 = 40.0 + rows.len() as f64 * (bar_h + 6.0);
    let h2 = 40.0 + rows.len() as f64 * (3.0 * 7.0 + 10.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        h1 + h2 + 40.0
    );
    let max_tp = rows.iter().map(|x| x.throughput).fold(1.0, f64::max);
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">Throughput (ops/s)</text>"
    );
    for (i, x) in rows.iter().enumerate() {
        let y = 34.0 + i as f64 * (bar_h + 6.0);
        let bw = chart_w * x.throughput / max_tp;
        let color = match x.strategy.as_str() {
            "anchor" => "#888888",
            "naive" => "#d62728",
            "lock" => "#ff7f0e",
            _ => "#1f77b4",
        };
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} / {}</text>",
            left - 6.0,
            y + 13.0,
            x.scenario,
            x.strategy
        );
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{y}\" width=\"{bw:.1}\" height=\"{bar_h}\" fill=\"{color}\"/>"
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\">{:.0}</text>",
            left + bw + 4.0,
            y + 13.0,
            x.throughput
        );
    }
    let top = h1 + 30.0;
    let max_lat = rows
        .iter()
        .map(|x| x.p999_ms.unwrap_or(x.p99_ms))
        .fold(0.001, f64::max);
    let _ = writeln!(s, "<text x=\"10\" y=\"{}\" font-size=\"14\" font-weight=\"bold\">Latency, ms (p50 / p99 / p999)</text>", top - 10.0);
    for (i, x) in rows.iter().enumerate() {
        let y = top + i as f64 * (3.0 * 7.0 + 10.0);
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} / {}</text>",
            left - 6.0,
            y + 14.0,
            x.scenario,
            x.strategy
        );
        for (j, (v, color)) in [
            (Some(x.p50_ms), "#9ecae1"),
            (Some(x.p99_ms), "#3182bd"),
            (x.p999_ms, "#08519c"),
        ]
        .iter()
        .enumerate()
        {
            if let Some(v) = v {
                let bw = chart_w * v / max_lat;
                let yy = y + j as f64 * 7.0;
                let _ = writeln!(s, "<rect x=\"{left}\" y=\"{yy}\" width=\"{bw:.1}\" height=\"6\" fill=\"{color}\"/>");
                if j == 1 {
                    let _ = writeln!(
                        s,
                        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">p99 {:.3}</text>",
                        left + bw + 4.0,
                        yy + 7.0,
                        v
                    );
                }
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
