//! Keeping secrets out of logs, metrics, errors and printed config. A Redis
//! URL may carry a password (`redis://:pw@host:port`), a PostgreSQL
//! connection string may carry one (`password=...` or `postgres://u:pw@h`).
//! Everything that shows a node or a database to a person or a scraper goes
//! through here first. Pure functions; never does I/O.

/// The `host:port` of a `redis://` or `rediss://` URL, without user, password,
/// path or query: the form used in metric labels and error messages.
pub fn host_port(url: &str) -> String {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .unwrap_or(url);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// A `redis://` URL with its password (and user) replaced, for printing.
pub fn redis_url(url: &str) -> String {
    let scheme = if url.starts_with("rediss://") {
        "rediss://"
    } else {
        "redis://"
    };
    let has_user_info = url
        .strip_prefix(scheme)
        .is_some_and(|r| r.split(['/', '?', '#']).next().unwrap_or("").contains('@'));
    if has_user_info {
        format!("{scheme}<redacted>@{}", host_port(url))
    } else {
        url.to_owned()
    }
}

/// A PostgreSQL connection string (key=value or URL form) with its password
/// replaced, for printing.
pub fn postgres_url(url: &str) -> String {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let scheme = &url[..url.len() - rest.len()];
        let (auth, host) = match rest.split_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let auth = auth.map(|a| match a.split_once(':') {
            Some((user, _)) => format!("{user}:<redacted>@"),
            None => format!("{a}@"),
        });
        let (host, query) = match host.split_once('?') {
            Some((h, q)) => (h, Some(q)),
            None => (host, None),
        };
        let query = query.map(|q| {
            q.split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => {
                        format!("{k}=<redacted>")
                    }
                    _ => kv.to_owned(),
                })
                .collect::<Vec<_>>()
                .join("&")
        });
        let mut out = format!("{scheme}{}{host}", auth.unwrap_or_default());
        if let Some(q) = query {
            out.push('?');
            out.push_str(&q);
        }
        return out;
    }
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=<redacted>"),
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
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
        for pg in [
            "host=127.0.0.1 user=postgres password=PgPw-S3cret dbname=x",
            "postgres://postgres:PgPw-S3cret@127.0.0.1:5432/x",
            "postgresql://postgres@127.0.0.1/x?password=PgPw-S3cret&sslmode=disable",
        ] {
            let shown = postgres_url(pg);
            assert!(!shown.contains("S3cret"), "{shown}");
            assert!(shown.contains("127.0.0.1"), "{shown}");
        }
    }
}
