//! Builds the effective [`Config`] for the binary: defaults (the `ops/up`
//! topology), then a TOML file, then `FLASHSALE_*` environment variables.
//! Bad config fails here, naming the field and the reason.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use flashsale::Config;

/// Loads the config: `path` if given (it must exist), else defaults, with the
/// environment on top; validated.
pub fn load(path: Option<&Path>) -> Result<Config> {
    let mut config = match path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str::<Config>(&text).map_err(|e| parse_error(p, &text, &e))?
        }
        None => Config::default(),
    };
    apply_env(&mut config, |k| std::env::var(k).ok())?;
    config.validate().map_err(|e| anyhow!("config: {e}"))?;
    Ok(config)
}

/// A TOML error without the offending value (it may be a secret): the line
/// number, the key on that line, and the parser's message with every quoted
/// value in it replaced.
fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    let message = without_values(e.message().trim());
    let Some(start) = e.span().map(|s| s.start.min(text.len())) else {
        return anyhow!("{}: {message}", path.display());
    };
    let line = text[..start].matches('\n').count() + 1;
    let key = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim())
        .filter(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-\"".contains(c))
        });
    match key {
        Some(k) => anyhow!("{}: line {line} ({k}): {message}", path.display()),
        None => anyhow!("{}: line {line}: {message}", path.display()),
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

fn apply_env(config: &mut Config, get: impl Fn(&str) -> Option<String>) -> Result<()> {
    let list = |v: String| {
        v.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    };
    if let Some(v) = get("FLASHSALE_CLUSTER_NODES") {
        config.cluster_nodes = list(v);
    }
    if let Some(v) = get("FLASHSALE_LOCK_NODES") {
        config.lock_nodes = list(v);
    }
    if let Some(v) = get("FLASHSALE_POSTGRES_URL") {
        config.postgres_url = v;
    }
    if let Some(v) = get("FLASHSALE_LISTEN") {
        config.server.listen = v;
    }
    if let Some(v) = get("FLASHSALE_ADMIN_TOKEN") {
        config.server.admin_token = Some(v).filter(|t| !t.is_empty());
    }
    if let Some(v) = get("FLASHSALE_ACK") {
        config.ack = match v.as_str() {
            "leader" => flashsale::Ack::Leader,
            "replicated" => flashsale::Ack::Replicated,
            other => {
                return Err(anyhow!(
                    "FLASHSALE_ACK: expected leader or replicated, got {other:?}"
                ))
            }
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_overrides_the_file_and_bad_values_name_the_field() {
        let mut c = Config::default();
        apply_env(&mut c, |k| {
            (k == "FLASHSALE_CLUSTER_NODES").then(|| "redis://a:1, redis://b:2".into())
        })
        .expect("env applies");
        assert_eq!(c.cluster_nodes, vec!["redis://a:1", "redis://b:2"]);
        let err = apply_env(&mut c, |k| (k == "FLASHSALE_ACK").then(|| "all".into())).unwrap_err();
        assert!(err.to_string().contains("FLASHSALE_ACK"));
        let err = toml::from_str::<Config>("max_qty = 0").map(|c| c.validate());
        assert!(matches!(err, Ok(Err(e)) if e.contains("max_qty")));
        assert!(toml::from_str::<Config>("no_such_field = 1").is_err());
        assert_eq!(
            without_values("invalid type: string \"redis://:S3cret@h:1\", expected a sequence"),
            "invalid type: string \"<value>\", expected a sequence"
        );
    }
}
