//! `mf-forward [--netns PATH] LISTEN=TARGET...`: TCP forwards into the real node's network namespace.
//! See `modelfleet_e2e::forward`.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Parser;
use modelfleet_e2e::forward::{self, Forward};

/// TCP forwards from this network namespace into another one.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The network namespace targets are dialled in (e.g. /run/netns/modelfleet); none: this one.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// LISTEN=TARGET pairs, e.g. 127.0.0.1:6443=127.0.0.1:6443.
    #[arg(required = true)]
    forwards: Vec<Forward>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    forward::run(args.netns, args.forwards)
}
