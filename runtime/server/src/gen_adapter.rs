//! `gen-adapter DIR --base MODEL --rank R --seed N [--targets M,…]`: the command line of
//! `modelfleet-testkit`'s random PEFT LoRA adapters (see [`gen_adapter()`]), re-exported so the
//! runtime's code and tests name it as before.

use clap::Args;
pub use modelfleet_testkit::gen_adapter::gen_adapter;
use std::path::PathBuf;
use std::process::ExitCode;

/// `gen-adapter` flags.
#[derive(Args, Debug)]
pub struct GenAdapterArgs {
    /// Output directory (created).
    pub dir: PathBuf,
    /// The base model (a Hugging Face directory or GGUF) whose shapes the adapter targets.
    #[arg(long)]
    pub base: PathBuf,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Target modules (comma-separated PEFT names); default all seven.
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
}

/// Runs the command.
pub fn run(args: GenAdapterArgs) -> ExitCode {
    match gen_adapter(&args.dir, &args.base, args.rank, args.seed, &args.targets) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modelfleet-runtime gen-adapter: {e}");
            ExitCode::FAILURE
        }
    }
}
