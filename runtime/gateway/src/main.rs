//! `modelfleet-gateway`: the fleet's front door. `run` serves one authenticated OpenAI endpoint for
//! every ModelDeployment in its scope (docs/design.md, "Gateway"; flags in docs/operations.md).

use clap::{Parser, Subcommand};
use modelfleet_gateway::config::RunArgs;
use std::process::ExitCode;

/// The modelfleet fleet gateway.
#[derive(Parser, Debug)]
#[command(name = "modelfleet-gateway", version = modelfleet_api::version::long(), about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the OpenAI API for the ModelDeployments in scope.
    Run(Box<RunArgs>),
    /// Print the limits store's hourly usage records as CSV (for billing).
    Usage(modelfleet_gateway::usage::UsageArgs),
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    let telemetry = match &command {
        Command::Run(args) => modelfleet_telemetry::init("modelfleet-gateway", &args.telemetry),
        Command::Usage(_) => modelfleet_telemetry::init("modelfleet-gateway", &Default::default()),
    };
    if let Some(w) = &telemetry.warning {
        tracing::warn!("{w}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("modelfleet-gateway: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        Command::Run(args) => runtime.block_on(modelfleet_gateway::serve::run(*args)),
        Command::Usage(args) => runtime.block_on(modelfleet_gateway::usage::run(args)),
    };
    // The async workers are done: the export thread gets a bounded time for the last spans.
    telemetry.shutdown(std::time::Duration::from_secs(3));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "modelfleet-gateway failed");
            ExitCode::FAILURE
        }
    }
}
