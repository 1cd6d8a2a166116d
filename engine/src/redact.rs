//! Keeping secrets out of logs, metrics, errors and printed config. A Redis
//! URL may carry a password (`redis://:pw@host:port`), a PostgreSQL
//! connection string may carry one (`password=...` or `postgres://u:pw@h`).
//! Everything that shows a node or a database to a person or a scraper goes
//! through here first. Pure functions; never does I/O. Each string is read
//! by the parser its driver uses (the url crate for redis-rs,
//! tokio-postgres's own), so what is shown is what would connect.

use url::Url;

/// The `host:port` of a Redis URL, without user, password, path or query:
/// the form used in metric labels and error messages (a Unix socket's path
/// for `redis+unix://`). Read with the url crate, as redis-rs reads it: a
/// URL the driver cannot read names no host.
pub fn host_port(url: &str) -> String {
    match Url::parse(url) {
        Ok(u) => match (u.host_str().filter(|h| !h.is_empty()), u.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            (None, _) if u.scheme().contains("unix") => u.path().to_owned(),
            (None, _) => NO_HOST.to_owned(),
        },
        Err(_) => NOT_A_URL.to_owned(),
    }
}

/// What [`host_port`] gives for a URL with no host.
const NO_HOST: &str = "<no host>";
/// What [`host_port`] gives for a string that is not a URL.
const NOT_A_URL: &str = "<not a URL>";

/// A Redis URL with its user info (user and password) and every query
/// parameter that may hold a password replaced, for printing. Parsed with
/// the url crate, redis-rs's own parser (six rounds of hand-written
/// splitting each let another password through: a '#', '/' or '@' in it,
/// tabs the parser drops, an '@' in the query): what it cannot parse, or
/// parses to no host, is hidden whole, scheme aside.
pub fn redis_url(url: &str) -> String {
    let Ok(u) = Url::parse(url) else {
        return "<Redis URL hidden: it does not parse>".into();
    };
    let scheme = u.scheme();
    let host = u.host_str().filter(|h| !h.is_empty());
    let unix = scheme.contains("unix");
    if u.cannot_be_a_base() || (host.is_none() && !unix) {
        return format!("{scheme}://<redacted: no host>");
    }
    let user_info = if u.username().is_empty() && u.password().is_none() {
        ""
    } else {
        "<redacted>@"
    };
    let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = u
        .query()
        .map(|q| format!("?{}", redact_query(q)))
        .unwrap_or_default();
    format!(
        "{scheme}://{user_info}{}{port}{}{query}",
        host.unwrap_or(""),
        u.path()
    )
}

/// A PostgreSQL connection string (libpq key=value or URL form) as
/// tokio-postgres reads it, shown by its host, port, user and database, the
/// password (if any) as `<redacted>`. Read by the driver's own parser, so
/// what is shown is what it connects with, and no quoting or escape of
/// ours can carry a password out. A string it cannot read is hidden whole.
#[cfg(feature = "postgres")]
pub fn postgres_url(url: &str) -> String {
    use tokio_postgres::config::Host;
    // libpq's TLS options first, as the pool reads them: the driver alone
    // refuses `sslmode=verify-full`.
    let Ok((driver_url, tls)) = crate::pg_tls::PgTls::split(url) else {
        return HIDDEN_PG.into();
    };
    let Ok(c) = driver_url.parse::<tokio_postgres::Config>() else {
        return HIDDEN_PG.into();
    };
    let mut shown = Vec::new();
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .map(|h| match h {
            // The driver ends the user info at the first '@': a password
            // with an '@' of its own, unescaped, leaves its tail in the
            // host, and no real host has one.
            Host::Tcp(h) if h.contains('@') => "<redacted>".to_owned(),
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    if !hosts.is_empty() {
        shown.push(format!("host={}", quoted(&hosts.join(","))));
    }
    // The addresses connected to when given (the host is then only the
    // name the certificate is checked against).
    let addrs: Vec<String> = c.get_hostaddrs().iter().map(|a| a.to_string()).collect();
    if !addrs.is_empty() {
        shown.push(format!("hostaddr={}", addrs.join(",")));
    }
    let ports: Vec<String> = c.get_ports().iter().map(u16::to_string).collect();
    if !ports.is_empty() {
        shown.push(format!("port={}", ports.join(",")));
    }
    if let Some(user) = c.get_user() {
        shown.push(format!("user={}", quoted(user)));
    }
    if let Some(db) = c.get_dbname() {
        shown.push(format!("dbname={}", quoted(db)));
    }
    if c.get_password().is_some() {
        shown.push("password=<redacted>".into());
    }
    if let Some(mode) = tls.mode_name() {
        shown.push(format!("sslmode={mode}"));
    }
    shown.join(" ")
}

/// Without the `postgres` feature there is no driver to read the string
/// with: it is hidden whole.
#[cfg(not(feature = "postgres"))]
pub fn postgres_url(_url: &str) -> String {
    HIDDEN_PG.into()
}

/// What [`postgres_url`] shows for a string it cannot read.
const HIDDEN_PG: &str = "<connection string hidden: it does not parse>";

/// A libpq value as it would be written: in single quotes, with `\` and `'`
/// escaped, when it holds a space, a quote or a backslash, or is empty.
#[cfg(feature = "postgres")]
fn quoted(v: &str) -> String {
    if !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
        return v.to_owned();
    }
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A URL's query with the value of every parameter that may be a password
/// replaced. The name is compared as the drivers read it, percent-decoded
/// (tokio-postgres takes `pass%77ord` for `password`), and anything holding
/// "pass" counts (redis-rs reads a Unix socket's password from `pass`).
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if secret_name(k) => format!("{k}=<redacted>"),
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether a query parameter's name, percent-decoded as the url crate
/// decodes it (`+` as a space), may name a password.
fn secret_name(name: &str) -> bool {
    url::form_urlencoded::parse(format!("{name}=").as_bytes())
        .next()
        .is_some_and(|(k, _)| k.to_ascii_lowercase().contains("pass"))
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive() {
        for url in [
            "redis://:LockPw-S3cret@127.0.0.1:7101",
            "redis://user:LockPw-S3cret@127.0.0.1:7101/0",
            "rediss://default:LockPw-S3cret@host.example:6380?x=1",
        ] {
            assert!(!host_port(url).contains("S3cret"), "{url}");
            assert!(!redis_url(url).contains("S3cret"), "{url}");
        }
        assert_eq!(host_port("redis://:pw@127.0.0.1:7101"), "127.0.0.1:7101");
        assert_eq!(host_port("redis://127.0.0.1:7101"), "127.0.0.1:7101");
        assert_eq!(
            redis_url("redis://127.0.0.1:7101"),
            "redis://127.0.0.1:7101"
        );
        for url in [
            "redis://:pa#S3cret@127.0.0.1:7001",
            "redis://:pa/S3cret?x@127.0.0.1:7001",
            "REDIS://:S3cret@127.0.0.1:7001",
            " redis://:S3cret@127.0.0.1:7001",
            "redis:/:S3cret@127.0.0.1:7001",
        ] {
            assert!(
                !redis_url(url).contains("S3cret"),
                "{url}: {}",
                redis_url(url)
            );
            assert!(!host_port(url).contains("S3cret"), "{url}");
        }
        // What redis-rs reads is shown as it reads it; what it cannot read
        // names no host.
        assert_eq!(
            host_port("REDIS://:S3cret@127.0.0.1:7001"),
            "127.0.0.1:7001"
        );
        assert_eq!(
            host_port(" redis://:S3cret@127.0.0.1:7001"),
            "127.0.0.1:7001"
        );
        assert_eq!(host_port("redis://:pa#S3cret@127.0.0.1:7001"), NOT_A_URL);
        assert_eq!(host_port("redis:/:S3cret@127.0.0.1:7001"), NO_HOST);
        assert_eq!(
            redis_url("redis://u:S3cret@[::1]:7001/2?protocol=resp3&password=S3cret"),
            "redis://<redacted>@[::1]:7001/2?protocol=resp3&password=<redacted>"
        );
        assert_eq!(
            redis_url("redis+unix:///tmp/x.sock?db=1&pass=S3cret"),
            "redis+unix:///tmp/x.sock?db=1&pass=<redacted>"
        );
        // What the drivers read as a password though it is not spelled
        // `password` plainly: redis-rs takes a Unix socket's from `?pass=`,
        // tokio-postgres percent-decodes a URL's parameter names and reads a
        // backslash in a bare key=value value as an escape.
        for url in [
            // From the second attack: an '@' inside the query's password,
            // and a name the url crate reads as `pass` once it drops the
            // tabs and line breaks it ignores.
            "redis+unix:///tmp/x.sock?pass=Ab@S3cretTail",
            "redis+unix:///tmp/x.sock?pa\tss=S3cret",
            "unix:///tmp/x.sock?p\nass=S3cret",
            "redis://:Leak3d?pass=S3cret@127.0.0.1:7460",
            "redis+unix:///tmp/x.sock?pass=S3cret",
            "unix:///tmp/x.sock?db=1&Pass=S3cret",
            "redis+unix:///tmp/x.sock?pa%73s=S3cret",
        ] {
            assert!(
                !redis_url(url).contains("S3cret"),
                "{url}: {}",
                redis_url(url)
            );
        }
        for pg in [
            // From the second attack: an '@' inside the query's password.
            "postgres://fs@db.internal/fs?sslmode=disable&password=Tr0ub4dor@S3cretTail",
            "postgres://fs@db.internal/fs?password=p@ss?S3cretword",
            "postgres://fs@db.internal/fs?password=ab@x=S3cret",
            // An '@' in the query: the driver's user info ends at the first.
            "postgres://postgres@127.0.0.1/DB?password=Pa@ssS3cret&application_name=fs@prod",
            "postgres://fs@db.internal/fs?password=S3cretPw&application_name=fs@prod",
            "postgres://u@h/db?options=-c%20x%3Dy@z&password=S3cret",
            "postgres://u@h/db?pass%77ord=PgPw-S3cret",
            "postgres://u@h/db?%70assword=PgPw-S3cret&sslmode=disable",
            "host=h password=ab\\ user=PgPw-S3cret",
            "host=h password=a\\b\\ c\\ PgPw-S3cret dbname=x",
            "host=127.0.0.1 user=postgres password=PgPw-S3cret dbname=x",
            "host=127.0.0.1 password = PgPw-S3cret dbname=x",
            "host=127.0.0.1 password='my PgPw-S3cret' dbname=x",
            "host=127.0.0.1 password='it\\'s PgPw-S3cret' dbname=x",
            "host=127.0.0.1 password='unterminated PgPw-S3cret",
            "postgres://postgres:PgPw-S3cret@127.0.0.1:5432/x",
            "postgres://u:p@PgPw-S3cret@127.0.0.1/x",
            "postgresql://postgres@127.0.0.1/x?password=PgPw-S3cret&sslmode=disable",
            "host=db password=PgPw-S3cret sslmode=verify-full sslrootcert=/ca.crt",
            "postgres://u:PgPw-S3cret@db/x?sslmode=verify-ca&sslrootcert=%2Fca.crt",
            "host=db password=PgPw-S3cret sslmode=verify-full",
            "postgres://127.0.0.1:7500/x?user=postgres&password=p@PgPw-S3cret&sslmode=verify-full",
        ] {
            let shown = postgres_url(pg);
            assert!(!shown.contains("S3cret"), "{pg}: {shown}");
        }
        assert_eq!(
            postgres_url("postgres://fs:S3cret@db.internal:5433/orders?sslmode=disable"),
            "host=db.internal port=5433 user=fs dbname=orders password=<redacted>"
        );
        assert_eq!(
            postgres_url("host=db.internal user=fs password=S3cret sslmode=verify-full sslrootcert='/etc/ca.crt'"),
            "host=db.internal user=fs password=<redacted> sslmode=verify-full"
        );
        assert_eq!(
            postgres_url("host=wrong.example hostaddr=127.0.0.1 port=5433 sslmode=require"),
            "host=wrong.example hostaddr=127.0.0.1 port=5433 sslmode=require"
        );
        assert_eq!(
            postgres_url("host=127.0.0.1 user=postgres dbname='my db'"),
            "host=127.0.0.1 user=postgres dbname='my db'"
        );
    }
}
