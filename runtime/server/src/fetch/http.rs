//! HTTP downloads for `fetch`: streaming to disk, retried on transient errors and resumed with `Range`
//! when the server supports it; and the Hugging Face Hub's file listing.
//!
//! Retries: connection errors, timeouts, 408/429/5xx and bodies cut short are retried up to
//! [`MAX_ATTEMPTS`] times with exponential backoff; 4xx answers are final. Tokens go only into the
//! `Authorization` header, never into messages.

use super::FetchError;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Attempts per file before giving up.
pub const MAX_ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The client used for every download.
pub fn client() -> Result<reqwest::Client, FetchError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("modelfleet-runtime/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| FetchError::InvalidArgument(format!("HTTP client: {e}")))
}

enum Attempt {
    Done,
    Retry(String),
}

/// Downloads `url` to the file `to`, resuming after partial transfers. `shown` names the source in errors.
pub async fn download(
    client: &reqwest::Client,
    url: &str,
    to: &Path,
    token: Option<&str>,
    shown: &str,
) -> Result<(), FetchError> {
    let mut last = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(FIRST_BACKOFF * 2u32.pow(attempt - 1)).await;
        }
        match try_once(client, url, to, token, shown).await? {
            Attempt::Done => return Ok(()),
            Attempt::Retry(why) => last = why,
        }
    }
    Err(FetchError::SourceUnavailable(format!(
        "{shown}: giving up after {MAX_ATTEMPTS} attempts: {last}"
    )))
}

async fn try_once(
    client: &reqwest::Client,
    url: &str,
    to: &Path,
    token: Option<&str>,
    shown: &str,
) -> Result<Attempt, FetchError> {
    let have = tokio::fs::metadata(to).await.map(|m| m.len()).unwrap_or(0);
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if have > 0 {
        request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    let mut resp = match request.send().await {
        Ok(r) => r,
        Err(e) => return Ok(Attempt::Retry(without_url(&e))),
    };
    let status = resp.status();
    let append = match status.as_u16() {
        206 if have > 0 => true,
        200 => false,
        416 if have > 0 => {
            // Our partial file is not a prefix the server recognises: start over.
            tokio::fs::remove_file(to)
                .await
                .map_err(FetchError::io(to.display().to_string()))?;
            return Ok(Attempt::Retry("range not satisfiable; restarting".into()));
        }
        408 | 429 | 500..=599 => return Ok(Attempt::Retry(format!("HTTP {status}"))),
        _ => return Err(FetchError::SourceUnavailable(format!("{shown}: HTTP {status}"))),
    };
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(to)
        .await
        .map_err(FetchError::io(to.display().to_string()))?;
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => file
                .write_all(&bytes)
                .await
                .map_err(FetchError::io(to.display().to_string()))?,
            Ok(None) => break,
            Err(e) => {
                file.flush()
                    .await
                    .map_err(FetchError::io(to.display().to_string()))?;
                return Ok(Attempt::Retry(format!("body interrupted: {}", without_url(&e))));
            }
        }
    }
    file.flush()
        .await
        .map_err(FetchError::io(to.display().to_string()))?;
    Ok(Attempt::Done)
}

/// A reqwest error's message without the URL (which may carry credentials).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text
}

/// Lists the files of a Hub repository at a revision (`GET /api/models/{repo}/revision/{revision}`).
pub async fn hf_list_files(
    client: &reqwest::Client,
    endpoint: &str,
    repo: &str,
    revision: &str,
    token: Option<&str>,
) -> Result<Vec<String>, FetchError> {
    #[derive(serde::Deserialize)]
    struct Sibling {
        rfilename: String,
    }
    #[derive(serde::Deserialize)]
    struct Info {
        siblings: Vec<Sibling>,
    }
    let url = format!("{endpoint}/api/models/{repo}/revision/{revision}");
    let shown = format!("hf://{repo}@{revision}");
    let mut last = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(FIRST_BACKOFF * 2u32.pow(attempt - 1)).await;
        }
        let mut request = client.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let resp = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                last = without_url(&e);
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
        let info: Info = resp.json().await.map_err(|e| {
            FetchError::SourceUnavailable(format!("{shown}: bad file listing: {}", without_url(&e)))
        })?;
        return Ok(info.siblings.into_iter().map(|s| s.rfilename).collect());
    }
    Err(FetchError::SourceUnavailable(format!(
        "{shown}: giving up after {MAX_ATTEMPTS} attempts: {last}"
    )))
}
