//! `gen-model DIR --shape S --seed N [--dtype D] [--format safetensors|gguf]`: the command line of
//! `modelfleet-testkit`'s model generator (random weights, real shapes; see [`gen_model()`]). The
//! generator's types are re-exported so the runtime's code and tests name them as before.

pub use modelfleet_testkit::gen_model::{
    GenDType, GenFormat, GenModelError, GenModelOptions, Shape, gen_model,
};
use std::path::PathBuf;

/// The `gen-model` command line.
#[derive(Debug, clap::Args)]
pub struct GenModelArgs {
    /// Directory to write (created if missing).
    pub dir: PathBuf,
    /// Architecture and size.
    #[arg(long, value_enum)]
    pub shape: Shape,
    /// Seed of every random value; the same seed gives byte-identical files.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Weight dtype (q8_0 and q4_0 with `--format gguf` only).
    #[arg(long, value_enum, default_value_t = GenDType::F32)]
    pub dtype: GenDType,
    /// File format.
    #[arg(long, value_enum, default_value_t = GenFormat::Safetensors)]
    pub format: GenFormat,
}

/// Runs `gen-model`, printing the error on failure.
pub fn run(args: GenModelArgs) -> std::process::ExitCode {
    let opts = GenModelOptions {
        shape: args.shape,
        seed: args.seed,
        dtype: args.dtype,
        format: args.format,
    };
    match gen_model(&args.dir, &opts) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modelfleet-runtime gen-model: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
