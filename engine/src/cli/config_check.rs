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
            Ok(ExitCode::SUCCESS)
        }
    }
}
