//! `flashsale queue ...`: what an operator asks of a sale's waiting room.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use flashsale::{Engine, Settings};

#[derive(Subcommand)]
pub enum QueueCommand {
    /// Show a room: state, joined, waiting, admitted, admitted and not
    /// done, the admission rate.
    Status {
        /// The SKU.
        #[arg(long)]
        sku: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one queue command.
pub async fn run(settings: Settings, cmd: QueueCommand) -> Result<ExitCode> {
    let engine = Engine::connect(settings.engine).await?;
    match cmd {
        QueueCommand::Status { sku, json } => {
            let s = engine.room_status(&sku).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(ExitCode::SUCCESS);
            }
            let rate = s.rate_per_s.map_or("auto".to_owned(), |r| format!("{r}/s"));
            println!("sku                {}", s.sku);
            println!("state              {}", s.state);
            println!(
                "settings           rate {rate}, window {} ms, order {}, overbook {}",
                s.window_ms,
                serde_json::to_value(s.order)?.as_str().unwrap_or("?"),
                s.overbook
            );
            println!("joined             {}", s.joined);
            println!("waiting            {}", s.waiting);
            println!("admitted           {}", s.admitted);
            println!("admitted_not_done  {}", s.admitted_not_done);
            match s.admission_rate {
                Some(r) => println!("admission_rate     {r:.1}/s (last 10 s of rounds)"),
                None => println!("admission_rate     - (no admission in the last 10 s)"),
            }
            println!("state_flips        {}", s.state_flips);
        }
    }
    Ok(ExitCode::SUCCESS)
}
