//! Keeping secrets out of logs, metrics, errors and printed config. A Redis
//! URL may carry a password (`redis://:pw@host:port`), a PostgreSQL
//! connection string may carry one (`password=...` or `postgres://u:pw@h`).
//! Everything that shows a node or a database to a person or a scraper goes
//! through here first. Pure functions; never does I/O.

/// The `host:port` of a `redis://` or `rediss://` URL, without user, password,
/// path or query: the form used in metric labels and error messages.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    // The password may hold '/', '?' or '#': the host starts after the last
    // '@', whatever comes before it.
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// A Redis URL with everything before its host (user and password)
/// replaced, for printing. Works on URLs that are not valid too (a mistyped
/// scheme must not put the password in the error that says so).
pub fn redis_url(url: &str) -> String {
    // A Unix socket's password comes in the query (`?pass=`); the query is
    // looked for after the user info, which is hidden whole.
    match url.rsplit_once('@') {
        None => with_redacted_query(url),
        Some((before, after)) => {
            // The query began before the last '@' (an '@' inside a query
            // value): where the secret ends cannot be told, so nothing
            // after the scheme is shown.
            let after = &if before.contains('?') {
                String::new()
            } else {
                with_redacted_query(after)
            };
            let scheme = before.split_once("://").map_or("", |(s, _)| s);
            let scheme = if scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
            {
                scheme
            } else {
                ""
            };
            let at = if after.is_empty() { "" } else { "@" };
            if scheme.is_empty() {
                format!("<redacted>{at}{after}")
            } else {
                format!("{scheme}://<redacted>{at}{after}")
            }
        }
    }
}

/// A PostgreSQL connection string (libpq key=value or URL form) with its
/// password replaced, for printing. A string that does not parse is hidden
/// whole: better nothing than a password.
pub fn postgres_url(url: &str) -> String {
    let trimmed = url.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        return postgres_uri(trimmed);
    }
    match key_values(trimmed) {
        Some(pairs) => pairs
            .into_iter()
            .map(|(k, v)| {
                if secret_name(&k) {
                    format!("{k}=<redacted>")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        None => "<connection string hidden: it does not parse>".into(),
    }
}

/// `postgres://user:password@host/db?password=...`: the user info ends at
/// the last '@' (a password may hold one).
fn postgres_uri(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (auth, host) = match rest.rsplit_once('@') {
        Some((a, h)) => (Some(a), h),
        None => (None, rest),
    };
    // tokio-postgres ends the user info at the first '@', this at the last
    // (a password may hold one): whatever lies between is shown only when
    // it is a plain user name, so an '@' in the query cannot carry a
    // password out in it.
    let plain = |u: &str| {
        u.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '~' | '%'))
    };
    // The query began before the last '@' (an '@' inside a query value,
    // which the driver allows): where the secret ends cannot be told, so
    // nothing after the scheme is shown.
    if auth.is_some_and(|a| a.contains('?')) {
        return format!("{scheme}://<redacted>");
    }
    let auth = auth
        .map(|a| match a.split_once(':') {
            _ if plain(a) => format!("{a}@"),
            Some((user, _)) if plain(user) => format!("{user}:<redacted>@"),
            _ => "<redacted>@".to_owned(),
        })
        .unwrap_or_default();
    format!("{scheme}://{auth}{}", with_redacted_query(host))
}

/// `rest` (what follows a URL's user info) with its query, if any,
/// redacted.
fn with_redacted_query(rest: &str) -> String {
    match rest.split_once('?') {
        Some((base, query)) => format!("{base}?{}", redact_query(query)),
        None => rest.to_owned(),
    }
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

/// Whether a parameter name, percent-decoded, may name a password. ASCII
/// tabs and line breaks are dropped first, as the url crate (redis-rs's
/// parser) drops them anywhere in a URL: `pa<TAB>ss` is read as `pass`.
fn secret_name(name: &str) -> bool {
    let name: String = name
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let bytes = name.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                decoded.push(((hex(h).unwrap_or(0) << 4) | hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                decoded.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded)
        .to_ascii_lowercase()
        .contains("pass")
}

/// libpq's `key = value` list: spaces around '=' allowed, values bare or in
/// single quotes with backslash escapes. `None` when it does not parse.
fn key_values(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if key.is_empty() || chars.next() != Some('=') {
            return None;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next()? {
                    '\\' => value.push(chars.next()?),
                    '\'' => break,
                    c => value.push(c),
                }
            }
            value = format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"));
        } else {
            // A backslash escapes the next character here too (tokio-postgres
            // reads `password=a\ b` as "a b"): kept as written, so the value
            // shown is the one the driver reads.
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
                if c == '\\' {
                    value.push(chars.next()?);
                }
            }
        }
        out.push((key, value));
    }
}

#[cfg(test)]
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
            assert_eq!(host_port(url), "127.0.0.1:7001", "{url}");
        }
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
        ] {
            let shown = postgres_url(pg);
            assert!(!shown.contains("S3cret"), "{pg}: {shown}");
        }
    }
}
