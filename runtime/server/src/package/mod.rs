//! `modelfleet-runtime package PATH --to oci://registry/repo[:tag] [--format modelpack|image]`: writes a
//! model directory (or one file) as a CNCF ModelPack artifact or a model image, pushes it, and prints
//! the manifest digest and the `spec.model` to paste into a ModelDeployment.
//!
//! Invariants: the output is byte-for-byte reproducible from the same files ([`plan`], [`artifact`]):
//! two runs give the same manifest digest, so a digest in Git means the same bytes everywhere; the
//! canonical digest printed is the one `fetch` checks after pulling, whichever shape was written.

pub mod artifact;
pub mod plan;
pub mod push;

use crate::fetch::source::oci::auth::DockerConfig;
use crate::fetch::source::oci::{OciRef, client};
use crate::fetch::{Access, FetchError};
use artifact::Format;
use std::path::PathBuf;
use std::process::ExitCode;

/// `package PATH --to oci://registry/repository[:tag]`.
#[derive(clap::Args, Debug)]
pub struct PackageArgs {
    /// The model: a Hugging Face model directory, a `.gguf` file, or a directory holding one.
    pub path: PathBuf,
    /// Where to push: `oci://registry/repository[:tag]` (no digest: the push makes it).
    #[arg(long)]
    pub to: String,
    /// `modelpack` (a CNCF ModelPack artifact, fetched into the node cache) or `image` (a model image,
    /// mounted by the node as an image volume).
    #[arg(long, value_enum, default_value = "modelpack")]
    pub format: Format,
    /// Speak plain HTTP to the registry (a local registry without TLS).
    #[arg(long, env = "MODELFLEET_PLAIN_HTTP")]
    pub plain_http: bool,
    /// Registry credentials: a docker config file (`docker login`/`buildah login` write one). Default:
    /// `$REGISTRY_AUTH_FILE`, else `~/.docker/config.json`, if it exists.
    #[arg(long, env = "REGISTRY_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// PEM certificates trusted besides the system's roots.
    #[arg(long, env = "MODELFLEET_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

/// Runs the command.
pub fn run(args: PackageArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("package: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(package(&args)) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("package: {}", e.termination_message());
            ExitCode::from(e.exit_code())
        }
    }
}

/// What a push made: the artifact's reference by digest and the model's canonical digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packaged {
    /// `oci://registry/repository[:tag]@sha256:…`.
    pub uri: String,
    /// The model's canonical digest (`spec.model.digest`).
    pub digest: String,
    /// The shape written.
    pub format: Format,
}

impl std::fmt::Display for Packaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "# pushed {} ({:?})", self.uri, self.format)?;
        writeln!(f, "spec:")?;
        writeln!(f, "  model:")?;
        writeln!(f, "    uri: {}", self.uri)?;
        write!(f, "    digest: \"{}\"", self.digest)?;
        if self.format == Format::Image {
            write!(f, "\n    delivery: ImageVolume")?;
        }
        Ok(())
    }
}

/// Reads, hashes, builds and pushes; returns what to put in `spec.model`.
pub async fn package(args: &PackageArgs) -> Result<Packaged, FetchError> {
    let target = parse_target(&args.to)?;
    let root = args.path.clone();
    let model = tokio::task::spawn_blocking(move || plan::model(&root))
        .await
        .map_err(|e| FetchError::io("hashing the model")(std::io::Error::other(e.to_string())))??;
    let name = args
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (format, files) = (args.format, model.files.clone());
    let built = {
        let model = plan::Model {
            files,
            digest: model.digest.clone(),
        };
        tokio::task::spawn_blocking(move || artifact::build(&model, format, &name))
            .await
            .map_err(|e| FetchError::io("building the artifact")(std::io::Error::other(e.to_string())))?
            .map_err(FetchError::io("reading the model's files"))?
    };
    if args.format == Format::Image && built.layers.len() > plan::MAX_IMAGE_LAYERS {
        return Err(FetchError::InvalidArgument(format!(
            "{} layers: a model image holds at most {} (use --format modelpack)",
            built.layers.len(),
            plan::MAX_IMAGE_LAYERS
        )));
    }
    let access = Access {
        registry_plain_http: args.plain_http,
        registry_auth: auth_file(args).map(|p| DockerConfig::read(&p)).transpose()?,
        ca_file: args.ca_file.clone(),
        ..Access::default()
    };
    let oci = client::connect_for_push(&access, &target).await?;
    push::push(&oci, &target, &model, &built).await?;
    let pinned = target.at(&built.manifest_digest);
    Ok(Packaged {
        uri: pinned.display(),
        digest: model.digest,
        format: args.format,
    })
}

/// `oci://registry/repository[:tag]`, without a digest.
fn parse_target(to: &str) -> Result<OciRef, FetchError> {
    let invalid = |why: &str| FetchError::InvalidArgument(format!("--to {to:?}: {why}"));
    let rest = to
        .strip_prefix("oci://")
        .ok_or_else(|| invalid("expected oci://registry/repository[:tag]"))?;
    if rest.contains('@') {
        return Err(invalid("no digest: the push computes it"));
    }
    let placeholder = format!("{rest}@sha256:{}", "0".repeat(64));
    OciRef::parse(&placeholder, invalid)
}

fn auth_file(args: &PackageArgs) -> Option<PathBuf> {
    args.auth_file.clone().or_else(|| {
        let home = std::env::var_os("HOME")?;
        let p = PathBuf::from(home).join(".docker/config.json");
        p.is_file().then_some(p)
    })
}
