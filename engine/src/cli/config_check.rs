//! `flashsale config check`: validates the settings (file, then
//! environment) and prints the effective values as TOML, secrets redacted.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use flashsale::Settings;

/// Subcommands of `flashsale config`.
#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Validate the config and print the effective values as TOML.
    Check,
}

/// Prints the effective settings. Loading already validated them.
pub fn run(settings: &Settings, cmd: ConfigCommand) -> Result<ExitCode> {
    match cmd {
        ConfigCommand::Check => {
            println!("{}", toml::to_string(&settings.redacted())?);
            println!("# {}", tls_plan(settings)?);
            println!("# {}", postgres_plan(settings)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// What the connections to `rediss://` nodes will verify, as a TOML comment
/// line (the output stays a config file). The `[tls]` files are read here,
/// so one missing or unreadable fails the check, not the first connect.
fn tls_plan(settings: &Settings) -> Result<String> {
    let e = &settings.engine;
    if !e.uses_tls() {
        return Ok(if e.tls == flashsale::TlsFiles::default() {
            "TLS: no rediss:// node; plain connections".to_owned()
        } else {
            "TLS: [tls] files are set, but no node is rediss://: they are not used".to_owned()
        });
    }
    flashsale::Certificates::load(&e.tls)?;
    let plain = e
        .lock_nodes
        .iter()
        .filter(|n| n.starts_with("redis://"))
        .count();
    let warning = if plain > 0 {
        format!(" (and {plain} lock node(s) over plain redis://, their passwords in clear)")
    } else {
        String::new()
    };
    Ok(format!("TLS: {}{warning}", e.tls.describe()))
}

/// What the connections to PostgreSQL will verify (libpq's `sslmode` and
/// `sslrootcert` in `postgres_url`), as a TOML comment line. The files are
/// read here, so a missing CA or a key that is not the certificate's fails
/// the check.
fn postgres_plan(settings: &Settings) -> Result<String> {
    let url = &settings.engine.postgres_url;
    let (_, tls) = flashsale::pg_tls::PgTls::split(url)?;
    // The pool reads the files the same way at start; nothing connects.
    flashsale::db::pool(url, 1)?;
    Ok(tls.describe())
}
