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
    Run(RunArgs),
    /// Print the limits store's hourly usage records as CSV (for billing).
    Usage(modelfleet_gateway::usage::UsageArgs),
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: in a container, escape codes land in `kubectl logs` and log shippers.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // The default reports a failed write with `eprintln!`, which panics when stderr is closed.
        .log_internal_errors(false)
        .try_init();
    let command = Cli::parse().command;
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("modelfleet-gateway: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        Command::Run(args) => runtime.block_on(modelfleet_gateway::serve::run(args)),
        Command::Usage(args) => runtime.block_on(modelfleet_gateway::usage::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "modelfleet-gateway failed");
            ExitCode::FAILURE
        }
    }
}
