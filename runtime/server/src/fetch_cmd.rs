//! The `modelfleet-runtime fetch` command line: flags (each also from `MODELFLEET_<FLAG>`), exit codes,
//! the progress endpoint the operator polls while a pod starts, and the termination message the
//! operator reads (a one-line reason on failure, the phases and their durations on success).

use crate::fetch::source::oci::auth::DockerConfig;
use crate::fetch::source::oci::signature::PublicKey;
use crate::fetch::source::s3::S3Access;
use crate::fetch::{Access, FetchError, FetchRequest, Fetched, Source, fetch};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `fetch --uri URI --digest sha256:HEX (--dest DIR [--cache DIR] | --mounted DIR)`.
#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    /// `file:///path`, `http(s)://host/path/file`, `hf://org/repo@revision`,
    /// `oci://registry/repo[:tag]@sha256:…`, `s3://bucket/prefix`, or (with --mounted)
    /// `pvc://claim/path`.
    #[arg(long, env = "MODELFLEET_URI")]
    pub uri: String,
    /// The canonical digest the artifact must have: `sha256:<64 hex>`.
    #[arg(long, env = "MODELFLEET_DIGEST")]
    pub digest: String,
    /// Directory that receives the verified artifact (a single file lands as DEST/<file name>).
    #[arg(
        long,
        env = "MODELFLEET_DEST",
        required_unless_present = "mounted",
        conflicts_with = "mounted"
    )]
    pub dest: Option<PathBuf>,
    /// The artifact is already mounted here (an image volume, a PVC): check its signature (oci://) and
    /// digest; download and write nothing.
    #[arg(long, env = "MODELFLEET_MOUNTED")]
    pub mounted: Option<PathBuf>,
    /// Digest-keyed cache directory, re-verified and reused instead of downloading again.
    #[arg(long, env = "MODELFLEET_CACHE")]
    pub cache: Option<PathBuf>,
    /// Hugging Face Hub endpoint for hf:// URIs; the only origin `HF_TOKEN` is ever sent to.
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    pub hf_endpoint: String,
    /// Directory of credential files (a mounted Secret): `HF_TOKEN`; `.dockerconfigjson` (or
    /// `config.json`) for oci:// registries; `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`) for s3://. Files override the environment.
    #[arg(long, env = "MODELFLEET_CREDENTIALS_DIR")]
    pub credentials_dir: Option<PathBuf>,
    /// PEM ECDSA P-256 public key (cosign's): an oci:// artifact must carry a cosign signature that
    /// verifies with it, checked before anything is downloaded.
    #[arg(long, env = "MODELFLEET_PUBLIC_KEY")]
    pub public_key: Option<PathBuf>,
    /// Speak plain HTTP to the oci:// URI's registry (a registry inside the cluster without TLS).
    #[arg(long, env = "MODELFLEET_PLAIN_HTTP")]
    pub plain_http: bool,
    /// Endpoint of an S3-compatible store for s3:// URIs (`http(s)://host:port`); AWS's by default.
    #[arg(long, env = "MODELFLEET_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Region of the s3:// bucket (default us-east-1).
    #[arg(long, env = "MODELFLEET_S3_REGION")]
    pub s3_region: Option<String>,
    /// Path-style S3 requests (`endpoint/bucket/key`), which most S3-compatible stores need.
    #[arg(long, env = "MODELFLEET_S3_PATH_STYLE")]
    pub s3_path_style: bool,
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
    /// Serve `GET /progress` (JSON: phase, bytes, expected bytes, seconds) on this address while the
    /// fetch runs, e.g. `$POD_IP:8001` (the operator polls it to show progress).
    #[arg(long, env = "MODELFLEET_PROGRESS_ADDR")]
    pub progress_addr: Option<String>,
    /// Where the one-line failure reason, or the success summary, goes (written only if the file
    /// exists, as in a pod, unless the flag is given explicitly).
    #[arg(long, env = "MODELFLEET_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
}

const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// Runs the command; secrets (tokens, registry credentials) come from the environment and the
/// credentials directory, go only to their own source and are never printed.
pub fn run(args: FetchArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(&args, &FetchError::io("starting the async runtime")(e)),
    };
    let req = match request(&args) {
        Ok(r) => r,
        Err(e) => return fail(&args, &e),
    };
    let progress_server = args
        .progress_addr
        .as_deref()
        .and_then(|addr| runtime.block_on(crate::fetch::progress_http::serve(addr, req.progress.clone())));
    let result = runtime.block_on(async {
        match &args.mounted {
            Some(dir) => crate::fetch::check_mounted(&req, dir).await.map(|()| None),
            None => fetch(&req).await.map(Some),
        }
    });
    drop(progress_server);
    match result {
        Ok(how) => {
            let summary = summary(&req, how);
            eprintln!("fetch: {summary}");
            write_termination_log(args.termination_log.as_deref(), &summary);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&args, &e),
    }
}

fn fail(args: &FetchArgs, e: &FetchError) -> ExitCode {
    let line = e.termination_message();
    eprintln!("fetch: {line}");
    write_termination_log(args.termination_log.as_deref(), &line);
    ExitCode::from(e.exit_code())
}

/// The request the flags describe, credentials read from the environment and the directory.
fn request(args: &FetchArgs) -> Result<FetchRequest, FetchError> {
    let source = Source::parse(&args.uri)?;
    let dest = args.dest.clone().unwrap_or_default();
    let creds = args.credentials_dir.as_deref();
    let hf_token = match creds.map(|d| d.join("HF_TOKEN")).filter(|p| p.is_file()) {
        Some(p) => Some(read_secret(&p)?),
        None => std::env::var("HF_TOKEN").ok(),
    }
    .filter(|t| !t.is_empty());
    let docker = creds.and_then(|d| {
        [".dockerconfigjson", "config.json"]
            .into_iter()
            .map(|n| d.join(n))
            .find(|p| p.is_file())
    });
    let registry_auth = docker.map(|p| DockerConfig::read(&p)).transpose()?;
    let signature_key = args.public_key.as_deref().map(PublicKey::read).transpose()?;
    let s3_keys = creds.map(S3Access::read_keys).transpose()?.flatten();
    Ok(FetchRequest {
        cache: args.cache.clone(),
        limits: crate::fetch::Limits {
            max_bytes: args.max_bytes,
            timeout: Some(std::time::Duration::from_secs(args.timeout_seconds.max(1))),
        },
        access: Access {
            hf_endpoint: args.hf_endpoint.clone(),
            hf_token,
            ca_file: args.ca_file.clone(),
            registry_plain_http: args.plain_http,
            registry_auth,
            s3: S3Access {
                endpoint: args.s3_endpoint.clone(),
                region: args.s3_region.clone(),
                path_style: args.s3_path_style,
                keys: s3_keys,
            },
        },
        signature_key,
        ..FetchRequest::new(source, args.digest.clone(), dest)
    })
}

fn read_secret(path: &Path) -> Result<String, FetchError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(FetchError::io(format!("reading {}", path.display())))
}

/// `Fetched: <how>, <bytes>; pull 12.3 s, verify 2.1 s, install 0.0 s` — what the operator reads
/// from a successful init container (the phases' durations go into an Event).
fn summary(req: &FetchRequest, how: Option<Fetched>) -> String {
    let s = req.progress.snapshot();
    let how = match how {
        Some(Fetched::AlreadyPresent) => "already present",
        Some(Fetched::FromCache) => "from the node cache",
        Some(Fetched::FromSource) => "from the source",
        None => "mounted",
    };
    let phases: Vec<String> = s
        .phases
        .iter()
        .map(|(p, secs)| format!("{} {secs:.1} s", p.name()))
        .collect();
    format!(
        "Fetched: {} ({}) {how}, {} bytes; {}",
        req.source.display(),
        req.digest,
        s.bytes,
        phases.join(", ")
    )
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
