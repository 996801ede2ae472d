//! `hf://org/repo@revision`: every file of a Hugging Face Hub repository at a revision (a branch, tag
//! or commit; `main` when none is given), listed through the Hub's API and downloaded file by file
//! through [`download`].
//!
//! Invariants: the listing is bounded in bytes; every listed name must be a safe relative path
//! ([`super::safe_relative`]) or the fetch fails; the token (`HF_TOKEN`) goes only to the configured
//! endpoint's origin ([`download::Credential`]).

use super::super::limits::Budget;
use super::super::{FetchError, FetchRequest, download};
use reqwest::Url;
use std::fs;
use std::path::Path;

/// A Hub repository at a revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfRepo {
    /// `org/repo`.
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
}

impl HfRepo {
    /// Parses what follows `hf://`.
    pub fn parse(rest: &str, invalid: impl Fn(&str) -> FetchError) -> Result<HfRepo, FetchError> {
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
        Ok(HfRepo {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// `hf://org/repo@revision`.
    pub fn display(&self) -> String {
        format!("hf://{}@{}", self.repo, self.revision)
    }

    /// Downloads every file of the repository into `staging`, within `budget`.
    pub async fn download_into(
        &self,
        staging: &Path,
        req: &FetchRequest,
        budget: &mut Budget,
    ) -> Result<(), FetchError> {
        let access = &req.access;
        let cred = download::Credential::new(&access.hf_endpoint, access.hf_token.as_deref());
        let client = download::client(access.ca_file.as_deref())?;
        let endpoint = access.hf_endpoint.trim_end_matches('/');
        let (repo, revision) = (&self.repo, &self.revision);
        let files = list_files(&client, endpoint, repo, revision, cred.as_ref()).await?;
        if files.is_empty() {
            return Err(FetchError::SourceUnavailable(format!(
                "{} has no files",
                self.display()
            )));
        }
        for file in files {
            let rel = super::safe_relative(&file).ok_or_else(|| {
                FetchError::SourceUnavailable(format!("{} lists an unsafe path {file:?}", self.display()))
            })?;
            let to = staging.join(&rel);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent).map_err(FetchError::io(parent.display().to_string()))?;
            }
            let url = Url::parse(&format!("{endpoint}/{repo}/resolve/{revision}/{file}"))
                .map_err(|e| FetchError::InvalidArgument(format!("--hf-endpoint {endpoint:?}: {e}")))?;
            let shown = format!("{}/{file}", self.display());
            download::download(&client, &url, &to, cred.as_ref(), budget, &shown, &req.progress).await?;
        }
        Ok(())
    }
}

/// Most bytes of a Hub file listing read.
const MAX_LISTING_BYTES: usize = 16 << 20;

/// Lists the files of a Hub repository at a revision (`GET /api/models/{repo}/revision/{revision}`).
async fn list_files(
    client: &reqwest::Client,
    endpoint: &str,
    repo: &str,
    revision: &str,
    cred: Option<&download::Credential>,
) -> Result<Vec<String>, FetchError> {
    #[derive(serde::Deserialize)]
    struct Sibling {
        rfilename: String,
    }
    #[derive(serde::Deserialize)]
    struct Info {
        siblings: Vec<Sibling>,
    }
    let shown = format!("hf://{repo}@{revision}");
    let url = Url::parse(&format!("{endpoint}/api/models/{repo}/revision/{revision}"))
        .map_err(|e| FetchError::InvalidArgument(format!("--hf-endpoint {endpoint:?}: {e}")))?;
    let mut last = String::new();
    for attempt in 0..download::MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(download::FIRST_BACKOFF * 2u32.pow(attempt - 1)).await;
        }
        let mut resp = match download::get(client, &url, cred, None, &shown).await? {
            Ok(r) => r,
            Err(download::Transient(why)) => {
                last = why;
                continue;
            }
        };
        let status = resp.status();
        if matches!(status.as_u16(), 408 | 429 | 500..=599) {
            last = format!("HTTP {status}");
            continue;
        }
        if !status.is_success() {
            return Err(FetchError::SourceUnavailable(format!(
                "{shown}: listing files: HTTP {status}"
            )));
        }
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(bytes)) if body.len() + bytes.len() <= MAX_LISTING_BYTES => {
                    body.extend_from_slice(&bytes)
                }
                Ok(Some(_)) => {
                    return Err(FetchError::SourceUnavailable(format!(
                        "{shown}: the file listing is over {MAX_LISTING_BYTES} bytes"
                    )));
                }
                Ok(None) => break,
                Err(e) => {
                    last = format!("listing interrupted: {}", download::without_url(&e));
                    body.clear();
                    break;
                }
            }
        }
        if body.is_empty() && !last.is_empty() {
            continue;
        }
        let info: Info = serde_json::from_slice(&body)
            .map_err(|e| FetchError::SourceUnavailable(format!("{shown}: bad file listing: {e}")))?;
        return Ok(info.siblings.into_iter().map(|s| s.rfilename).collect());
    }
    Err(FetchError::SourceUnavailable(format!(
        "{shown}: giving up after {} attempts: {last}",
        download::MAX_ATTEMPTS
    )))
}
