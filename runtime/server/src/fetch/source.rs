//! Artifact sources: `file://`, `http(s)://` and `hf://org/repo@revision`, parsed once and then
//! downloaded (or copied) into a staging directory.
//!
//! Invariants: file names that come from a remote listing are relative paths without `..`, so a source can
//! never write outside the staging directory; credentials in URLs are never shown in messages.

use super::http::{self, Credential};
use super::limits::Budget;
use super::{FetchError, FetchRequest};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Where an artifact comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A local file or directory.
    File(PathBuf),
    /// One file over HTTP(S); it lands under the last path segment of the URL.
    Http(reqwest::Url),
    /// Every file of a Hugging Face Hub repository at a revision.
    HuggingFace {
        /// `org/repo`.
        repo: String,
        /// Branch, tag or commit.
        revision: String,
    },
}

impl Source {
    /// Parses a `--uri`.
    pub fn parse(uri: &str) -> Result<Source, FetchError> {
        let invalid = |why: &str| FetchError::InvalidArgument(format!("--uri {uri:?}: {why}"));
        if let Some(path) = uri.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(invalid("file:// URIs need an absolute path (file:///dir/model)"));
            }
            return Ok(Source::File(PathBuf::from(path)));
        }
        if uri.starts_with("http://") || uri.starts_with("https://") {
            let url = reqwest::Url::parse(uri).map_err(|e| invalid(&e.to_string()))?;
            file_name_of(&url).ok_or_else(|| invalid("the URL path must end in a file name"))?;
            return Ok(Source::Http(url));
        }
        if let Some(rest) = uri.strip_prefix("hf://") {
            let (repo, revision) = rest.split_once('@').unwrap_or((rest, "main"));
            let parts: Vec<&str> = repo.split('/').collect();
            let valid_part = |p: &&str| {
                !p.is_empty()
                    && *p != "."
                    && *p != ".."
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            };
            if parts.len() != 2 || !parts.iter().all(valid_part) {
                return Err(invalid("expected hf://org/repo@revision"));
            }
            if revision.is_empty() || revision.contains("..") || revision.starts_with('/') {
                return Err(invalid("the revision must be a branch, tag or commit"));
            }
            return Ok(Source::HuggingFace {
                repo: repo.to_string(),
                revision: revision.to_string(),
            });
        }
        Err(invalid(
            "unsupported scheme; use file://, http://, https:// or hf://",
        ))
    }

    /// The URI without credentials, for messages.
    pub fn display(&self) -> String {
        match self {
            Source::File(p) => format!("file://{}", p.display()),
            Source::Http(url) => {
                let mut shown = url.clone();
                let _ = shown.set_username("");
                let _ = shown.set_password(None);
                shown.set_query(None);
                shown.to_string()
            }
            Source::HuggingFace { repo, revision } => format!("hf://{repo}@{revision}"),
        }
    }

    /// Puts the artifact's files into `staging` (an empty directory), within `budget`.
    pub async fn download_into(
        &self,
        staging: &Path,
        req: &FetchRequest,
        budget: &mut Budget,
    ) -> Result<(), FetchError> {
        let cred = Credential::new(&req.hf_endpoint, req.token.as_deref());
        match self {
            Source::File(path) => {
                let (from, to, mut b) = (path.clone(), staging.to_path_buf(), budget.clone());
                let spent = tokio::task::spawn_blocking(move || copy_local(&from, &to, &mut b).map(|()| b))
                    .await
                    .map_err(|e| FetchError::Io {
                        context: "copying task".into(),
                        source: std::io::Error::other(e.to_string()),
                    })??;
                *budget = spent;
                Ok(())
            }
            Source::Http(url) => {
                let name = file_name_of(url).expect("checked when parsed");
                let client = http::client(req.ca_file.as_deref())?;
                http::download(
                    &client,
                    url,
                    &staging.join(name),
                    cred.as_ref(),
                    budget,
                    &self.display(),
                )
                .await
            }
            Source::HuggingFace { repo, revision } => {
                let client = http::client(req.ca_file.as_deref())?;
                let endpoint = req.hf_endpoint.trim_end_matches('/');
                let files = http::hf_list_files(&client, endpoint, repo, revision, cred.as_ref()).await?;
                if files.is_empty() {
                    return Err(FetchError::SourceUnavailable(format!(
                        "{} has no files",
                        self.display()
                    )));
                }
                for file in files {
                    let rel = safe_relative(&file).ok_or_else(|| {
                        FetchError::SourceUnavailable(format!(
                            "{} lists an unsafe path {file:?}",
                            self.display()
                        ))
                    })?;
                    let to = staging.join(&rel);
                    if let Some(parent) = to.parent() {
                        fs::create_dir_all(parent).map_err(FetchError::io(parent.display().to_string()))?;
                    }
                    let url = reqwest::Url::parse(&format!("{endpoint}/{repo}/resolve/{revision}/{file}"))
                        .map_err(|e| {
                            FetchError::InvalidArgument(format!("--hf-endpoint {endpoint:?}: {e}"))
                        })?;
                    http::download(
                        &client,
                        &url,
                        &to,
                        cred.as_ref(),
                        budget,
                        &format!("{}/{file}", self.display()),
                    )
                    .await?;
                }
                Ok(())
            }
        }
    }
}

/// The last non-empty path segment of a URL, if it is a plain file name.
fn file_name_of(url: &reqwest::Url) -> Option<String> {
    let name = url.path_segments()?.next_back()?.to_string();
    (!name.is_empty() && name != "." && name != "..").then_some(name)
}

/// A relative path made only of normal components (no `..`, no root, no `.`), or None.
pub fn safe_relative(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    ok.then(|| p.to_path_buf())
}

/// Copies a local file (as `staging/<name>`) or directory tree (its contents) without following
/// symlinks and without hard links: the staged bytes are a private copy, so what is verified is what
/// is later read, whatever happens to the source afterwards.
fn copy_local(from: &Path, staging: &Path, budget: &mut Budget) -> Result<(), FetchError> {
    let meta = fs::symlink_metadata(from)
        .map_err(|e| FetchError::SourceUnavailable(format!("file://{}: {e}", from.display())))?;
    if meta.is_file() {
        let name = from.file_name().ok_or_else(|| {
            FetchError::InvalidArgument(format!("file://{} has no file name", from.display()))
        })?;
        budget.check(meta.len())?;
        let copied = fs::copy(from, staging.join(name))
            .map_err(FetchError::io(format!("copying {}", from.display())))?;
        budget.spend(copied)
    } else if meta.is_dir() {
        budget.check(super::stage::tree_size(from)?)?;
        let copied = super::stage::copy_tree(from, staging, super::stage::Link::Never)?;
        budget.spend(copied)
    } else {
        Err(FetchError::SourceUnavailable(format!(
            "file://{} is not a regular file or directory (symlinks are refused)",
            from.display()
        )))
    }
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

    #[test]
    fn parses_uris() {
        check("file:///models/tiny", Ok(Source::File("/models/tiny".into())));
        check("file://models", Err("absolute path"));
        check(
            "hf://HuggingFaceTB/SmolLM2-135M@v1.0",
            Ok(Source::HuggingFace {
                repo: "HuggingFaceTB/SmolLM2-135M".into(),
                revision: "v1.0".into(),
            }),
        );
        check(
            "hf://org/repo",
            Ok(Source::HuggingFace {
                repo: "org/repo".into(),
                revision: "main".into(),
            }),
        );
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
