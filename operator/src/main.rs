//! `modelfleet-operator`: the controller binary. Subcommands:
//! - `crds [--out-dir DIR]` prints (or writes) the CRD YAML that `crds/` holds, generated from
//!   `modelfleet-crds`.
//!
//! The controller itself (`run`) arrives with the operator issue; this binary exists from the start so
//! later work adds subcommands rather than creating it.

use clap::{Parser, Subcommand};
use std::io::Write;

/// Kubernetes operator for LLM model fleets.
#[derive(Parser, Debug)]
#[command(name = "modelfleet-operator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print every CRD of the modelfleet.io API as YAML (pipe into `kubectl apply -f -`).
    Crds {
        /// Write one `<group>_<plural>.yaml` file per CRD into this directory instead of printing.
        #[arg(long)]
        out_dir: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out_dir: None } => {
            std::io::stdout().write_all(modelfleet_crds::all_crds_yaml().as_bytes())?;
        }
        Command::Crds { out_dir: Some(dir) } => {
            for crd in modelfleet_crds::crds() {
                let path = dir.join(modelfleet_crds::crd_file_name(&crd));
                std::fs::write(&path, modelfleet_crds::crd_yaml(&crd))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
