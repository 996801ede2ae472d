//! The `modelfleet-runtime fetch` command line: flags (each also from `MODELFLEET_<FLAG>`), exit codes and
//! the termination message the operator reads.

use crate::fetch::{FetchRequest, Fetched, Source, fetch};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `fetch --uri URI --digest sha256:HEX --dest DIR [--cache DIR]`.
#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    /// `file:///path`, `http(s)://host/path/file` or `hf://org/repo@revision`.
    #[arg(long, env = "MODELFLEET_URI")]
    pub uri: String,
    /// The canonical digest the artifact must have: `sha256:<64 hex>`.
    #[arg(long, env = "MODELFLEET_DIGEST")]
    pub digest: String,
    /// Directory that receives the verified artifact (a single file lands as DEST/<file name>).
    #[arg(long, env = "MODELFLEET_DEST")]
    pub dest: PathBuf,
    /// Digest-keyed cache directory, re-verified and reused instead of downloading again.
    #[arg(long, env = "MODELFLEET_CACHE")]
    pub cache: Option<PathBuf>,
    /// Hugging Face Hub endpoint for hf:// URIs; the only origin `HF_TOKEN` is ever sent to.
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    pub hf_endpoint: String,
    /// Most bytes the artifact may have (all files together). Default: the free space of DEST's file
    /// system (the operator passes the model volume's `sizeLimit` when it sets one).
    #[arg(long, env = "MODELFLEET_MAX_BYTES")]
    pub max_bytes: Option<u64>,
    /// Longest the download and its verification may take, in seconds.
    #[arg(long, env = "MODELFLEET_TIMEOUT_SECONDS", default_value_t = 3600)]
    pub timeout_seconds: u64,
    /// PEM file of certificates trusted for https besides the system's roots (a private mirror's CA).
    #[arg(long, env = "MODELFLEET_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Where the one-line failure reason goes (written only if the file exists, as in a pod, unless the
    /// flag is given explicitly).
    #[arg(long, env = "MODELFLEET_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
}

const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// Runs the command; the bearer token comes from `HF_TOKEN`, goes only to `--hf-endpoint`'s origin and
/// is never printed.
pub fn run(args: FetchArgs) -> ExitCode {
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
    let result = Source::parse(&args.uri).and_then(|source| {
        let req = FetchRequest {
            source,
            digest: args.digest.clone(),
            dest: args.dest.clone(),
            cache: args.cache.clone(),
            hf_endpoint: args.hf_endpoint.clone(),
            token,
            limits: crate::fetch::Limits {
                max_bytes: args.max_bytes,
                timeout: Some(std::time::Duration::from_secs(args.timeout_seconds.max(1))),
            },
            ca_file: args.ca_file.clone(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(crate::fetch::FetchError::io("starting the async runtime"))?;
        runtime
            .block_on(fetch(&req))
            .map(|how| (how, req.source.display()))
    });
    match result {
        Ok((how, shown)) => {
            let how = match how {
                Fetched::AlreadyPresent => "already present",
                Fetched::FromCache => "from the cache",
                Fetched::FromSource => "from the source",
            };
            eprintln!(
                "fetch: {shown} ({}) is in {} ({how})",
                args.digest,
                args.dest.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let line = e.termination_message();
            eprintln!("fetch: {line}");
            write_termination_log(args.termination_log.as_deref(), &line);
            ExitCode::from(e.exit_code())
        }
    }
}

pub(crate) fn write_termination_log(explicit: Option<&Path>, line: &str) {
    let (path, create) = match explicit {
        Some(p) => (p, true),
        None => (Path::new(DEFAULT_TERMINATION_LOG), false),
    };
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .create(create)
        .open(path);
    if let Ok(mut file) = opened {
        use std::io::Write;
        let _ = writeln!(file, "{line}");
    }
}
