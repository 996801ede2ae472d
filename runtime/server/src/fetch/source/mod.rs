//! The one seam between `fetch` and where artifacts come from: [`Source::parse`] picks a module by the
//! URI's scheme, and [`Source::download_into`] hands the staging directory to it. Each scheme is a
//! module of its own — `file.rs` (`file://`), `http.rs` (`http(s)://`), `hf.rs` (`hf://`), `oci/`
//! (`oci://`: ModelPack artifacts and model images), `s3.rs` (`s3://`), `pvc.rs` (`pvc://`, mounted) — so "how a source works" is read in one place; what they share (the HTTP transport, the byte budget, staging,
//! progress) lives beside this module in `fetch/`.
//!
//! Invariants: file names that come from a remote listing are relative paths without `..`
//! ([`safe_relative`]), so a source can never write outside the staging directory; credentials in
//! URLs are never shown in messages ([`Source::display`]).

pub mod file;
pub mod hf;
pub mod http;
pub mod oci;
pub mod pvc;
pub mod s3;

pub use hf::HfRepo;
pub use oci::OciRef;
pub use pvc::PvcPath;
pub use s3::S3Path;

use super::limits::Budget;
use super::{FetchError, FetchRequest};
use std::path::{Component, Path, PathBuf};

/// Where an artifact comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A local file or directory.
    File(PathBuf),
    /// One file over HTTP(S); it lands under the last path segment of the URL.
    Http(reqwest::Url),
    /// Every file of a Hugging Face Hub repository at a revision.
    HuggingFace(HfRepo),
    /// A ModelPack artifact or a model image in an OCI registry, pinned by manifest digest.
    Oci(OciRef),
    /// Objects in an S3 bucket (or an S3-compatible store) under a prefix.
    S3(S3Path),
    /// Files on a PersistentVolumeClaim the operator mounts read-only: checked in place, never copied.
    Pvc(PvcPath),
}

/// The schemes [`Source::parse`] accepts, for messages.
pub const SCHEMES: &str = "file://, http://, https://, hf://, oci://, s3:// or pvc://";

impl Source {
    /// Parses a `--uri`.
    pub fn parse(uri: &str) -> Result<Source, FetchError> {
        let invalid = |why: &str| FetchError::InvalidArgument(format!("--uri {uri:?}: {why}"));
        if let Some(path) = uri.strip_prefix("file://") {
            return file::parse(path, invalid).map(Source::File);
        }
        if uri.starts_with("http://") || uri.starts_with("https://") {
            return http::parse(uri, invalid).map(Source::Http);
        }
        if let Some(rest) = uri.strip_prefix("hf://") {
            return HfRepo::parse(rest, invalid).map(Source::HuggingFace);
        }
        if let Some(rest) = uri.strip_prefix("oci://") {
            return OciRef::parse(rest, invalid).map(Source::Oci);
        }
        if let Some(rest) = uri.strip_prefix("s3://") {
            return S3Path::parse(rest, invalid).map(Source::S3);
        }
        if let Some(rest) = uri.strip_prefix("pvc://") {
            return PvcPath::parse(rest, invalid).map(Source::Pvc);
        }
        Err(invalid(&format!("unsupported scheme; use {SCHEMES}")))
    }

    /// The URI's scheme (`file`, `http`, `https`, `hf`), what policies allow or refuse.
    pub fn scheme(&self) -> &str {
        match self {
            Source::File(_) => "file",
            Source::Http(url) => url.scheme(),
            Source::HuggingFace(_) => "hf",
            Source::Oci(_) => "oci",
            Source::S3(_) => "s3",
            Source::Pvc(_) => "pvc",
        }
    }

    /// The URI without credentials, for messages.
    pub fn display(&self) -> String {
        match self {
            Source::File(p) => format!("file://{}", p.display()),
            Source::Http(url) => http::display(url),
            Source::HuggingFace(repo) => repo.display(),
            Source::Oci(r) => r.display(),
            Source::S3(p) => p.display(),
            Source::Pvc(p) => p.display(),
        }
    }

    /// Puts the artifact's files into `staging` (an empty directory), within `budget`.
    pub async fn download_into(
        &self,
        staging: &Path,
        req: &FetchRequest,
        budget: &mut Budget,
    ) -> Result<(), FetchError> {
        if !matches!(self, Source::Oci(_)) {
            req.progress.enter(super::Phase::Pull);
        }
        match self {
            Source::File(path) => {
                let (from, to, mut b) = (path.clone(), staging.to_path_buf(), budget.clone());
                let progress = req.progress.clone();
                *budget = super::blocking(move || file::copy_into(&from, &to, &mut b, &progress).map(|()| b))
                    .await?;
                Ok(())
            }
            Source::Http(url) => http::download_into(url, staging, req, budget).await,
            Source::HuggingFace(repo) => repo.download_into(staging, req, budget).await,
            Source::Oci(r) => oci::download_into(r, staging, req, budget).await,
            Source::S3(p) => p.download_into(staging, req, budget).await,
            Source::Pvc(p) => Err(FetchError::InvalidArgument(format!(
                "{}: a pvc:// model is mounted, not copied",
                p.display()
            ))),
        }
    }
}

/// A relative path made only of normal components (no `..`, no root, no `.`), or None.
pub fn safe_relative(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    ok.then(|| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(uri: &str, expected: Result<Source, &str>) {
        match (Source::parse(uri), expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{uri}"),
            (Err(e), Err(fragment)) => assert!(e.to_string().contains(fragment), "{uri}: {e}"),
            (got, want) => panic!("{uri}: got {got:?}, want {want:?}"),
        }
    }

    fn hf(repo: &str, revision: &str) -> Source {
        Source::HuggingFace(HfRepo {
            repo: repo.into(),
            revision: revision.into(),
        })
    }

    #[test]
    fn parses_uris() {
        check("file:///models/tiny", Ok(Source::File("/models/tiny".into())));
        check("file://models", Err("absolute path"));
        check(
            "hf://HuggingFaceTB/SmolLM2-135M@v1.0",
            Ok(hf("HuggingFaceTB/SmolLM2-135M", "v1.0")),
        );
        check("hf://org/repo", Ok(hf("org/repo", "main")));
        check("hf://org", Err("expected hf://org/repo@revision"));
        check("hf://org/../x@main", Err("expected hf://org/repo@revision"));
        check("hf://org/repo@../../etc", Err("revision"));
        check("ftp://x/y", Err("unsupported scheme"));
        check("http://127.0.0.1:9/", Err("file name"));
        assert!(matches!(
            Source::parse("https://h/m/model.gguf"),
            Ok(Source::Http(_))
        ));
    }

    #[test]
    fn display_hides_credentials() {
        let s = Source::parse("https://user:secret@host/m.gguf?token=abc").unwrap();
        let shown = s.display();
        assert!(!shown.contains("secret") && !shown.contains("abc"), "{shown}");
    }

    #[test]
    fn safe_relative_paths() {
        assert_eq!(safe_relative("a/b.json"), Some(PathBuf::from("a/b.json")));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a"] {
            assert_eq!(safe_relative(bad), None, "{bad}");
        }
    }
}
