//! `modelfleet-runtime`: the runtime pod's binary. Subcommands:
//! - `fetch --uri URI --digest sha256:HEX (--dest DIR [--cache DIR] | --mounted DIR)` fetches and
//!   verifies an artifact (or checks a mounted one: an image volume, a PVC).
//! - `package PATH --to oci://registry/repo[:tag] [--format modelpack|image]` pushes a model as a CNCF
//!   ModelPack artifact or a model image and prints the `spec.model` to paste.
//! - `digest PATH` prints the canonical digest of a model or adapter directory, or of one file.
//! - `gen-model DIR --shape S --seed N [--dtype D] [--format safetensors|gguf]` writes a random-weight
//!   model in Hugging Face layout (or one GGUF file).
//! - `widen FILE.gguf --out OUT.gguf [--dtype f16|f32]` writes the same weights with the quantized
//!   tensors widened (the `make up` sample).
//! - `plan --model PATH|--config config.json [--max-model-len N] [--concurrency C] [--memory BYTES]`
//!   prints the memory arithmetic: weights, KV bytes per token and request, FLOPs, the KV pool that fits.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The modelfleet runtime: inference server and artifact tools.
#[derive(Parser, Debug)]
#[command(name = "modelfleet-runtime", version = modelfleet_api::version::long(), about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the OpenAI-compatible API for one model.
    Serve(Box<modelfleet_runtime::serve::ServeArgs>),
    /// Download or copy an artifact, verify its canonical digest, and only then put it into DEST.
    Fetch(Box<modelfleet_runtime::fetch_cmd::FetchArgs>),
    /// Push a model to an OCI registry as a CNCF ModelPack artifact or a model image (reproducibly) and
    /// print the `spec.model` that pins it.
    Package(modelfleet_runtime::package::PackageArgs),
    /// Print the canonical digest (`sha256:…`) of a model or adapter directory, or of one file.
    Digest {
        /// A directory (every regular file under it, hidden ones included) or a single file.
        path: PathBuf,
    },
    /// Write a random-weight Llama-family model of a real shape in Hugging Face layout.
    GenModel(modelfleet_runtime::gen_model::GenModelArgs),
    /// Write a random PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) for a base model.
    GenAdapter(modelfleet_runtime::gen_adapter::GenAdapterArgs),
    /// Write a GGUF file with its quantized tensors widened to f16 (or f32): the same weights, run on
    /// the float path with full-precision activations.
    Widen {
        /// The GGUF file to read.
        src: PathBuf,
        /// The GGUF file to write.
        #[arg(long)]
        out: PathBuf,
        /// The element type to store.
        #[arg(long, value_enum, default_value_t = modelfleet_testkit::widen::WidenTo::F16)]
        dtype: modelfleet_testkit::widen::WidenTo,
    },
    /// Print a model's memory arithmetic: weights, KV bytes per token and per request, FLOPs per token,
    /// and the KV pool `serve` would allocate in a given memory size.
    Plan(modelfleet_runtime::plan::PlanArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => modelfleet_runtime::serve::run(*args),
        Command::Fetch(args) => modelfleet_runtime::fetch_cmd::run(*args),
        Command::Package(args) => modelfleet_runtime::package::run(args),
        Command::GenModel(args) => modelfleet_runtime::gen_model::run(args),
        Command::GenAdapter(args) => modelfleet_runtime::gen_adapter::run(args),
        Command::Plan(args) => modelfleet_runtime::plan::run(args),
        Command::Widen { src, out, dtype } => {
            match modelfleet_testkit::widen::widen_gguf(&src, &out, dtype) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("modelfleet-runtime widen: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Digest { path } => match modelfleet_runtime::digest::digest_path(&path) {
            Ok(d) => {
                println!("{d}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("modelfleet-runtime digest: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
