//! The settings of the `flashsale` binary and the bench: the library's
//! [`Config`] plus the HTTP service's [`ServerConfig`], built from defaults
//! (the `ops/up` topology), then a TOML file, then `FLASHSALE_*` environment
//! variables. One loader, so `flashsale` and `flashsale-bench` read the same
//! file and variables the same way. Bad settings fail here, naming the field
//! and the reason, never echoing a value (it may be a secret).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::config::{within, Ack, Config};

/// Everything the binary runs with: the engine's config and the service's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Settings {
    /// What the library needs.
    #[serde(flatten)]
    pub engine: Config,
    /// What `flashsale serve` needs (the `[server]` table).
    pub server: ServerConfig,
}

/// Why the settings could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The file could not be read.
    #[error("reading {file}: {error}")]
    Read {
        /// The file.
        file: String,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or a value has the wrong type.
    #[error("{file}:{at}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// " line N (key)", when known.
        at: String,
        /// The parser's message, with every quoted value replaced.
        message: String,
    },
    /// An environment variable holds a value that cannot be used.
    #[error("{var}: {problem}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A value is out of its range.
    #[error("config: {0}")]
    Invalid(ConfigError),
}

impl From<ConfigError> for SettingsError {
    fn from(e: ConfigError) -> Self {
        SettingsError::Invalid(e)
    }
}

impl Settings {
    /// Loads the settings: `path` if given (it must exist), else defaults,
    /// with the environment on top; validated.
    pub fn load(path: Option<&Path>) -> Result<Settings, SettingsError> {
        let settings = Settings::read(path)?;
        settings.engine.validate()?;
        settings.server.validate()?;
        // Names resolved here, where a blocking look-up is fine (the
        // library's own check compares the text, then marker keys).
        if let Some((a, b)) = crate::lock::same_node(&settings.engine.lock_nodes, true) {
            return Err(ConfigError::new(
                "lock_nodes",
                format!("{a} and {b} are the same lock node: each must be a separate Redis"),
            )
            .into());
        }
        Ok(settings)
    }

    /// The settings as [`Settings::load`] builds them, not yet validated,
    /// for a caller that changes some values first (the bench) and then
    /// validates what it uses.
    pub fn read(path: Option<&Path>) -> Result<Settings, SettingsError> {
        let mut settings = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|error| SettingsError::Read {
                    file: p.display().to_string(),
                    error,
                })?;
                Settings::parse(&text).map_err(|e| parse_error(p, &text, &e))?
            }
            None => Settings::default(),
        };
        settings.apply_env(|k| std::env::var(k).ok())?;
        Ok(settings)
    }

    /// Parses a settings file: the `[server]` table is the service's, every
    /// other key the engine's. Errors keep their position in `text`.
    fn parse(text: &str) -> Result<Settings, ParseFailure> {
        let mut doc = toml::de::DeTable::parse(text)?;
        // serde would take an array for a table, field by position
        // (`server = ["0.0.0.0:1", "token"]`): only a table is a table here.
        for (key, value) in doc.get_ref().iter() {
            let key = key.get_ref().as_ref();
            if matches!(key, "server" | "retry" | "tls" | "room")
                && !matches!(value.get_ref(), toml::de::DeValue::Table(_))
            {
                return Err(ParseFailure::NotATable {
                    key: key.to_owned(),
                    span: value.span(),
                });
            }
        }
        let server_key = doc
            .get_ref()
            .keys()
            .find(|k| k.get_ref() == "server")
            .cloned();
        let server = match server_key.and_then(|k| doc.get_mut().remove(&k)) {
            Some(v) => ServerConfig::deserialize(toml::de::ValueDeserializer::from(v))?,
            None => ServerConfig::default(),
        };
        let engine = Config::deserialize(toml::de::Deserializer::from(doc))?;
        Ok(Settings { engine, server })
    }

    /// These settings with every secret replaced, for printing: node
    /// passwords, the PostgreSQL password, and the admin token (`<set>`).
    pub fn redacted(&self) -> Settings {
        let mut server = self.server.clone();
        server.admin_token = server.admin_token().map(|_| "<set>".into());
        Settings {
            engine: self.engine.redacted(),
            server,
        }
    }

    /// Applies the `FLASHSALE_*` variables that `get` knows.
    fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), SettingsError> {
        let list = |v: String| {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        if let Some(v) = get("FLASHSALE_CLUSTER_NODES") {
            self.engine.cluster_nodes = list(v);
        }
        if let Some(v) = get("FLASHSALE_LOCK_NODES") {
            self.engine.lock_nodes = list(v);
        }
        if let Some(v) = get("FLASHSALE_POSTGRES_URL") {
            self.engine.postgres_url = v;
        }
        if let Some(v) = get("FLASHSALE_LISTEN") {
            self.server.listen = v;
        }
        if let Some(v) = get("FLASHSALE_ROOM_SECRET") {
            self.engine.room.secret = Some(v).filter(|t| !t.is_empty());
        }
        if let Some(v) = get("FLASHSALE_ADMIN_TOKEN") {
            self.server.admin_token = Some(v).filter(|t| !t.is_empty());
        }
        if let Some(v) = get("FLASHSALE_ACK") {
            self.engine.ack = match v.as_str() {
                "leader" => Ack::Leader,
                "replicated" => Ack::Replicated,
                other => {
                    return Err(SettingsError::Env {
                        var: "FLASHSALE_ACK",
                        problem: format!("expected leader or replicated, got {other:?}"),
                    })
                }
            };
        }
        Ok(())
    }
}

/// Settings of the HTTP service (`flashsale serve`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: String,
    /// Bearer token for the admin routes (create, restock, close); at least
    /// 16 characters. Unset, empty or blank: the admin routes are off (401).
    pub admin_token: Option<String>,
    /// Purchases per second one user may make (token bucket); 0 = no limit.
    pub per_user_rps: f64,
    /// Burst of the per-user bucket.
    pub per_user_burst: u32,
    /// Purchases per second the whole service accepts; 0 = no limit.
    pub global_rps: f64,
    /// Burst of the global bucket.
    pub global_burst: u32,
    /// Requests handled at once; more wait for a slot.
    pub max_in_flight: usize,
    /// Run the order writer inside the service.
    pub order_writer: bool,
    /// How often the service reconciles the ledger (and exports the gauges).
    #[serde(with = "crate::config::millis", rename = "reconcile_every_ms")]
    pub reconcile_every: Duration,
    /// A client must send a request's headers within this.
    #[serde(with = "crate::config::millis", rename = "header_read_timeout_ms")]
    pub header_read_timeout: Duration,
    /// A client must send a request's body within this.
    #[serde(with = "crate::config::millis", rename = "body_read_timeout_ms")]
    pub body_read_timeout: Duration,
    /// A request is answered (503 `unavailable`) within this, counted from
    /// when its body was read: the wait for a slot and the handler. Admin
    /// operations still run to the end.
    #[serde(with = "crate::config::millis", rename = "request_timeout_ms")]
    pub request_timeout: Duration,
    /// A client must take each part of an answer within this, or its
    /// connection is closed (a client that never reads cannot hold one).
    #[serde(with = "crate::config::millis", rename = "write_timeout_ms")]
    pub write_timeout: Duration,
    /// Largest request head (request line and headers) a connection buffers,
    /// in bytes; larger heads are refused. Bounds memory per connection.
    pub max_header_bytes: usize,
    /// On SIGTERM, requests in flight get this long before their connections
    /// are closed; then the order writer drains and the process exits 0.
    #[serde(with = "crate::config::millis", rename = "shutdown_grace_ms")]
    pub shutdown_grace: Duration,
    /// Largest request body, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Most client connections open at once; more wait to be accepted.
    pub max_connections: usize,
    /// Address of a listener of its own for `/metrics`, `/readyz` and
    /// `/healthz`, so a flood of scrapes or probes on it shares neither
    /// connections nor slots with purchases; `/metrics` and `/readyz` then
    /// leave `listen` (which keeps `/healthz`). Unset: all on `listen`.
    pub metrics_listen: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            admin_token: None,
            per_user_rps: 5.0,
            per_user_burst: 5,
            global_rps: 0.0,
            global_burst: 1000,
            max_in_flight: 4096,
            order_writer: true,
            reconcile_every: Duration::from_secs(15),
            header_read_timeout: Duration::from_secs(5),
            body_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            max_connections: 10_000,
            metrics_listen: None,
        }
    }
}

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN: usize = 16;

impl ServerConfig {
    /// The admin token, or `None` when the admin routes are off (unset,
    /// empty or blank: one rule for `config check` and `serve`).
    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref().filter(|t| !t.trim().is_empty())
    }

    /// Checks the values that cannot be right; names the field that is not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::new(
                "server.listen",
                format!("{:?} is not an address like 127.0.0.1:8080", self.listen),
            ));
        }
        if let Some(m) = &self.metrics_listen {
            match m.parse::<std::net::SocketAddr>() {
                Err(_) => {
                    return Err(ConfigError::new(
                        "server.metrics_listen",
                        format!("{m:?} is not an address like 127.0.0.1:9464"),
                    ))
                }
                Ok(a) if self.listen.parse::<std::net::SocketAddr>().ok() == Some(a) => {
                    return Err(ConfigError::new(
                        "server.metrics_listen",
                        "must differ from server.listen",
                    ))
                }
                Ok(_) => {}
            }
        }
        if !(self.per_user_rps >= 0.0 && self.global_rps >= 0.0) {
            return Err(ConfigError::new(
                "server.per_user_rps / global_rps",
                "must be >= 0",
            ));
        }
        if self.per_user_rps > 0.0 && self.per_user_burst == 0 {
            return Err(ConfigError::new(
                "server.per_user_burst",
                "must be >= 1 when per_user_rps is set",
            ));
        }
        if self.global_rps > 0.0 && self.global_burst == 0 {
            return Err(ConfigError::new(
                "server.global_burst",
                "must be >= 1 when global_rps is set",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_in_flight) {
            return Err(ConfigError::new(
                "server.max_in_flight",
                "must be 1..=1000000",
            ));
        }
        // Counted without blanks: fifteen spaces and a letter are a
        // one-letter secret.
        if self
            .admin_token()
            .is_some_and(|t| t.chars().filter(|c| !c.is_whitespace()).count() < MIN_ADMIN_TOKEN)
        {
            return Err(ConfigError::new(
                "server.admin_token",
                format!(
                    "use at least {MIN_ADMIN_TOKEN} non-blank characters \
                 (or leave it unset to turn the admin routes off)"
                ),
            ));
        }
        let second = Duration::from_secs(1);
        let hour = Duration::from_secs(3600);
        within(
            "server.header_read_timeout_ms",
            self.header_read_timeout,
            Duration::from_millis(100),
            hour,
        )?;
        within(
            "server.body_read_timeout_ms",
            self.body_read_timeout,
            Duration::from_millis(100),
            hour,
        )?;
        within(
            "server.request_timeout_ms",
            self.request_timeout,
            second,
            hour,
        )?;
        within(
            "server.shutdown_grace_ms",
            self.shutdown_grace,
            Duration::ZERO,
            hour,
        )?;
        within(
            "server.write_timeout_ms",
            self.write_timeout,
            Duration::from_millis(100),
            hour,
        )?;
        // hyper's own floor is 8 KiB.
        if !(8192..=1024 * 1024).contains(&self.max_header_bytes) {
            return Err(ConfigError::new(
                "server.max_header_bytes",
                "must be 8192..=1048576",
            ));
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(ConfigError::new(
                "server.max_body_bytes",
                "must be 1024..=67108864",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err(ConfigError::new(
                "server.max_connections",
                "must be 1..=1000000",
            ));
        }
        within(
            "server.reconcile_every_ms",
            self.reconcile_every,
            Duration::from_millis(100),
            Duration::from_secs(24 * 3600),
        )?;
        Ok(())
    }
}

/// A TOML error without the offending value (it may be a secret): the line
/// number, the key on that line, and the parser's message with every quoted
/// value in it replaced.
/// Why a settings file did not parse.
#[derive(Debug)]
enum ParseFailure {
    /// TOML syntax, or a value serde refused.
    Toml(toml::de::Error),
    /// `server` or `retry` given as something other than a table.
    NotATable {
        key: String,
        span: std::ops::Range<usize>,
    },
}

impl From<toml::de::Error> for ParseFailure {
    fn from(e: toml::de::Error) -> Self {
        ParseFailure::Toml(e)
    }
}

fn parse_error(path: &Path, text: &str, e: &ParseFailure) -> SettingsError {
    let (span, message) = match e {
        ParseFailure::Toml(e) => (e.span(), without_values(e.message().trim())),
        ParseFailure::NotATable { key, span } => {
            (Some(span.clone()), format!("{key} must be a table"))
        }
    };
    let file = path.display().to_string();
    let Some(start) = span.map(|s| s.start.min(text.len())) else {
        return SettingsError::Parse {
            file,
            at: String::new(),
            message,
        };
    };
    let line = text[..start].matches('\n').count() + 1;
    let key = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim())
        .filter(|k| is_setting_name(k));
    let at = match key {
        Some(k) => format!(" line {line} ({k})"),
        None => format!(" line {line}"),
    };
    SettingsError::Parse { file, at, message }
}

/// True when `key` (as written before `=`, perhaps quoted or dotted) names a
/// setting. Only then is it shown in an error: the text before `=` on a
/// line inside a multi-line string is a value, possibly a secret.
fn is_setting_name(key: &str) -> bool {
    let key = key.trim_matches('"');
    let Ok(toml::Value::Table(all)) = toml::Value::try_from(Settings::default()) else {
        return false;
    };
    let named = |name: &str| {
        // Unset by default, so absent from the defaults' table.
        matches!(
            name,
            "admin_token"
                | "ca_file"
                | "cert_file"
                | "key_file"
                | "secret"
                | "previous_secret"
                | "key_id"
                | "previous_key_id"
        ) || all.iter().any(|(k, v)| {
            k == name || matches!(v, toml::Value::Table(inner) if inner.contains_key(name))
        })
    };
    let mut parts = key.split('.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(one), None, _) => named(one),
        (Some(table), Some(field), None) => {
            matches!(table, "server" | "retry" | "tls") && named(field.trim_matches('"'))
        }
        _ => false,
    }
}

/// `invalid type: string "redis://:pw@h", expected ...` with the quoted (or
/// backticked) parts replaced by `<value>`.
fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quote: Option<char> = None;
    for c in message.chars() {
        match quote {
            Some(q) if c == q => {
                out.push_str("<value>");
                out.push(c);
                quote = None;
            }
            Some(_) => {}
            None if c == '"' || c == '`' => {
                out.push(c);
                quote = Some(c);
            }
            None => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a TOML table, dotted (`server.listen`), leaves only.
    fn leaf_keys(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
        for (k, v) in table {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => leaf_keys(&key, t, out),
                _ => out.push(key),
            }
        }
    }

    /// The first ```toml block of a docs page.
    fn first_toml_block(page: &str) -> &str {
        page.split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("a toml block in the page")
    }

    /// docs/configuration.md cannot drift from the code: its example (with
    /// the keys it shows commented out, unset by default) parses as
    /// settings, so every key it names exists and takes the value shown,
    /// and every key the code has is in it.
    #[test]
    fn the_configuration_page_names_every_key_and_only_real_ones() {
        let block = first_toml_block(include_str!("../../docs/configuration.md"));
        // `# key = value` lines are keys shown unset: uncommented here.
        let text: String = block
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest
                        .split_once(" = ")
                        .is_some_and(|(k, _)| !k.contains(' ')) =>
                {
                    rest
                }
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let parsed = Settings::parse(&text);
        assert!(
            parsed.is_ok(),
            "the page's example does not parse: {:?}",
            parsed.err()
        );
        let documented: toml::Table = toml::from_str(&text).expect("TOML");
        let mut doc_keys = Vec::new();
        leaf_keys("", &documented, &mut doc_keys);
        let mut full = Settings::default();
        full.server.admin_token = Some("x".repeat(16));
        full.server.metrics_listen = Some("127.0.0.1:9464".into());
        full.engine.tls.ca_file = Some("ca.pem".into());
        full.engine.tls.cert_file = Some("client.pem".into());
        full.engine.tls.key_file = Some("client.key".into());
        full.engine.room.key_id = Some("k1".into());
        full.engine.room.secret = Some("s".repeat(32));
        full.engine.room.previous_key_id = Some("k0".into());
        full.engine.room.previous_secret = Some("p".repeat(32));
        let code: toml::Table =
            toml::from_str(&toml::to_string(&full).expect("serialize")).expect("TOML");
        let mut code_keys = Vec::new();
        leaf_keys("", &code, &mut code_keys);
        let missing: Vec<&String> = code_keys.iter().filter(|k| !doc_keys.contains(k)).collect();
        assert!(
            missing.is_empty(),
            "keys the page does not document: {missing:?}"
        );
    }

    /// docs/deployment.md's worked example is a config the binary takes:
    /// it parses, and both halves validate (the TLS file it names is read
    /// only at connect and by `config check`).
    #[test]
    fn the_deployment_example_is_a_valid_config() {
        let block = first_toml_block(include_str!("../../docs/deployment.md"));
        let s = Settings::parse(block).expect("the example parses");
        assert_eq!(s.engine.validate(), Ok(()));
        assert_eq!(s.server.validate(), Ok(()));
        assert!(s
            .engine
            .cluster_nodes
            .iter()
            .all(|n| n.starts_with("rediss://")));
        assert!(s.engine.tls.ca_file.is_some());
        #[cfg(feature = "postgres")]
        {
            let (_, pg) = crate::pg_tls::PgTls::split(&s.engine.postgres_url).expect("pg tls");
            assert_eq!(pg.mode, crate::pg_tls::SslMode::VerifyFull);
        }
    }

    #[test]
    fn environment_overrides_the_file_and_bad_values_name_the_field() {
        let mut s = Settings::default();
        s.apply_env(|k| {
            (k == "FLASHSALE_CLUSTER_NODES").then(|| "redis://a:1, redis://b:2".into())
        })
        .expect("env applies");
        assert_eq!(s.engine.cluster_nodes, vec!["redis://a:1", "redis://b:2"]);
        let err = s
            .apply_env(|k| (k == "FLASHSALE_ACK").then(|| "all".into()))
            .unwrap_err();
        assert!(err.to_string().contains("FLASHSALE_ACK"));
        for (text, field) in [
            ("batch_max = 1001", "batch_max"),
            ("batch_max = 0", "batch_max"),
            ("batch_in_flight = 0", "batch_in_flight"),
            ("batch_in_flight = 1025", "batch_in_flight"),
            ("batch_light_load = 65", "batch_light_load"),
            // The orders table's qty is a 32-bit integer: a larger purchase
            // would be confirmed, then dead-lettered by the order writer.
            ("max_qty = 2147483648", "max_qty"),
        ] {
            let parsed = Settings::parse(text).expect("parses");
            assert_eq!(
                parsed.engine.validate().map_err(|e| e.field),
                Err(field.into())
            );
        }
        let parsed = Settings::parse("max_qty = 0").expect("parses");
        let err = parsed.engine.validate().unwrap_err();
        assert_eq!(err.field, "max_qty");
        assert!(Settings::parse("no_such_field = 1").is_err());
        let fields = Settings::parse("order_record = \"fields\"").expect("parses");
        assert_eq!(fields.engine.order_record, crate::OrderRecord::Fields);
        assert_eq!(
            Settings::default().engine.order_record,
            crate::OrderRecord::Compact
        );
        let text = "order_record = \"csv\"";
        let err = parse_error(
            Path::new("f.toml"),
            text,
            &Settings::parse(text).unwrap_err(),
        );
        assert!(err.to_string().contains("order_record"), "{err}");
        assert!(Settings::parse("[server]\nno_such_field = 1").is_err());
        assert_eq!(
            without_values("invalid type: string \"redis://:S3cret@h:1\", expected a sequence"),
            "invalid type: string \"<value>\", expected a sequence"
        );
    }

    /// The `[server]` table goes to the service and the rest to the engine,
    /// and a wrong type is reported at its line.
    #[test]
    fn the_server_table_is_the_services_and_errors_keep_their_line() {
        let s =
            Settings::parse("max_qty = 7\n[server]\nlisten = \"127.0.0.1:9\"\n").expect("parses");
        assert_eq!(s.engine.max_qty, 7);
        assert_eq!(s.server.listen, "127.0.0.1:9");
        let text = "max_qty = 7\n\n[server]\nmax_body_bytes = \"big\"\n";
        let e = Settings::parse(text).unwrap_err();
        let shown = parse_error(Path::new("f.toml"), text, &e).to_string();
        assert!(shown.contains("line 4 (max_body_bytes)"), "{shown}");
        let text = "max_qty = 7\nack = 3\n";
        let e = Settings::parse(text).unwrap_err();
        let shown = parse_error(Path::new("f.toml"), text, &e).to_string();
        assert!(shown.contains("line 2 (ack)"), "{shown}");
        // A line inside a multi-line string is not a key, whatever it looks
        // like: nothing before its `=` is shown.
        let text = "[server]\nadmin_token = \"\"\"\nS3cretLine=zz\\q\n\"\"\"\n";
        let e = Settings::parse(text).unwrap_err();
        let shown = parse_error(Path::new("f.toml"), text, &e).to_string();
        assert!(!shown.contains("S3cret"), "{shown}");
        let text = "cluster_nodes = [\n \"redis://h:1\",\n S3cretElem=1,\n]\n";
        let e = Settings::parse(text).unwrap_err();
        let shown = parse_error(Path::new("f.toml"), text, &e).to_string();
        assert!(!shown.contains("S3cret"), "{shown}");
        // Tables must be tables: serde alone would fill one from an array.
        for text in [
            "server = [\"127.0.0.1:1\", \"abcdefghijklmnopqrstuv\"]\n",
            "retry = [5, 6, 7]\n",
            "server = []\n",
        ] {
            let e = Settings::parse(text).unwrap_err();
            let shown = parse_error(Path::new("f.toml"), text, &e).to_string();
            assert!(shown.contains("must be a table"), "{shown}");
            assert!(!shown.contains("abcdef"), "{shown}");
        }
        assert!(Settings::parse("server = { listen = \"127.0.0.1:9\" }\n").is_ok());
        assert!(Settings::parse("server.listen = \"127.0.0.1:9\"\n").is_ok());
        // Printed settings parse back to the same settings.
        let printed = toml::to_string(&Settings::default()).expect("prints");
        assert_eq!(
            Settings::parse(&printed).expect("parses back"),
            Settings::default()
        );
    }
}
