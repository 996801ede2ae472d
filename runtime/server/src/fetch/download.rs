//! The HTTP transport of `fetch`'s web sources (`http(s)://`, `hf://`): streaming to disk, retried on
//! transient errors and resumed with `Range` when the server supports it.
//!
//! Retries: connection errors, timeouts, 408/429/5xx and bodies cut short are retried up to
//! [`MAX_ATTEMPTS`] times with exponential backoff; 4xx answers are final, and so is a download past the
//! byte budget ([`super::limits`]).
//!
//! Credentials: the bearer token (`HF_TOKEN`) belongs to one origin, the configured Hugging Face
//! endpoint ([`Credential`]); it goes into the `Authorization` header of requests to that origin only,
//! never into messages. Redirects are followed by hand, one hop at a time ([`redirect_target`]): only to
//! `https://` URLs, at most [`MAX_REDIRECTS`] of them, and each hop carries the token only if it is on
//! the token's origin — a redirect can never move the credential to another host.

use super::FetchError;
use super::limits::Budget;
use super::progress::Progress;
use reqwest::Url;
use std::fmt;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Attempts per file before giving up.
pub const MAX_ATTEMPTS: u32 = 6;
/// Redirect hops followed per request.
pub const MAX_REDIRECTS: usize = 10;
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// A bearer token and the one origin (scheme, host, port) it may be sent to.
#[derive(Clone)]
pub struct Credential {
    /// `scheme://host:port` of the endpoint (never the opaque `null` origin: only http(s) endpoints).
    origin: String,
    token: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credential({}, <redacted>)", self.origin)
    }
}

impl Credential {
    /// `token` for the origin of `endpoint` (the Hugging Face endpoint); `None` without a token or
    /// with an endpoint that is not an http(s) URL.
    pub fn new(endpoint: &str, token: Option<&str>) -> Option<Credential> {
        let token = token.filter(|t| !t.is_empty())?;
        let url = Url::parse(endpoint).ok()?;
        if !matches!(url.scheme(), "http" | "https") {
            return None;
        }
        Some(Credential {
            origin: url.origin().ascii_serialization(),
            token: token.to_string(),
        })
    }

    /// The token, if `url` is on its origin.
    pub fn token_for(&self, url: &Url) -> Option<&str> {
        (url.origin().ascii_serialization() == self.origin).then_some(self.token.as_str())
    }
}

/// Where a redirect from `current` with `Location: location` leads, if it may be followed: relative
/// locations resolve against `current`; the target must be `https://`.
pub fn redirect_target(current: &Url, location: &str) -> Result<Url, String> {
    let next = current
        .join(location)
        .map_err(|e| format!("redirect to an invalid location ({e})"))?;
    if next.scheme() != "https" {
        return Err(format!(
            "redirect to a {}:// URL refused (only https:// redirects are followed)",
            next.scheme()
        ));
    }
    Ok(next)
}

/// The client used for every download: no automatic redirects (see the module docs), and the PEM
/// certificates of `ca_file` trusted besides the system's roots.
pub fn client(ca_file: Option<&Path>) -> Result<reqwest::Client, FetchError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("modelfleet-runtime/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(FetchError::io(format!("--ca-file {}", path.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| FetchError::InvalidArgument(format!("--ca-file {}: {}", path.display(), e)))?;
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .map_err(|e| FetchError::InvalidArgument(format!("HTTP client: {e}")))
}

/// A request's outcome that a retry may fix.
pub(crate) struct Transient(pub(crate) String);

/// GETs `url` (with `Range: bytes=<from>-` if given), following redirects as the module docs say.
pub(crate) async fn get(
    client: &reqwest::Client,
    url: &Url,
    cred: Option<&Credential>,
    from: Option<u64>,
    shown: &str,
) -> Result<Result<reqwest::Response, Transient>, FetchError> {
    let mut url = url.clone();
    for _ in 0..=MAX_REDIRECTS {
        let mut request = client.get(url.clone());
        if let Some(token) = cred.and_then(|c| c.token_for(&url)) {
            request = request.bearer_auth(token);
        }
        if let Some(have) = from {
            request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let resp = match request.send().await {
            Ok(r) => r,
            Err(e) => return Ok(Err(Transient(without_url(&e)))),
        };
        if !resp.status().is_redirection() || resp.status() == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(Ok(resp));
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                FetchError::SourceUnavailable(format!("{shown}: HTTP {} without a Location", resp.status()))
            })?;
        url = redirect_target(&url, location)
            .map_err(|why| FetchError::SourceUnavailable(format!("{shown}: {why}")))?;
    }
    Err(FetchError::SourceUnavailable(format!(
        "{shown}: more than {MAX_REDIRECTS} redirects"
    )))
}

enum Attempt {
    Done,
    Retry(String),
}

/// Downloads `url` to the file `to`, resuming after partial transfers, within `budget` (which the
/// file's size is then charged to). `shown` names the source in errors.
pub async fn download(
    client: &reqwest::Client,
    url: &Url,
    to: &Path,
    cred: Option<&Credential>,
    budget: &mut Budget,
    shown: &str,
    progress: &Progress,
) -> Result<(), FetchError> {
    let (mut last, mut announced) = (String::new(), false);
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(FIRST_BACKOFF * 2u32.pow(attempt - 1)).await;
        }
        match try_once(client, url, to, cred, budget, shown, (progress, &mut announced)).await? {
            Attempt::Done => {
                let len = tokio::fs::metadata(to)
                    .await
                    .map_err(FetchError::io(to.display().to_string()))?
                    .len();
                return budget.spend(len);
            }
            Attempt::Retry(why) => last = why,
        }
    }
    Err(FetchError::SourceUnavailable(format!(
        "{shown}: giving up after {MAX_ATTEMPTS} attempts: {last}"
    )))
}

async fn try_once(
    client: &reqwest::Client,
    url: &Url,
    to: &Path,
    cred: Option<&Credential>,
    budget: &Budget,
    shown: &str,
    (progress, announced): (&Progress, &mut bool),
) -> Result<Attempt, FetchError> {
    let have = tokio::fs::metadata(to).await.map(|m| m.len()).unwrap_or(0);
    let mut resp = match get(client, url, cred, (have > 0).then_some(have), shown).await? {
        Ok(r) => r,
        Err(Transient(why)) => return Ok(Attempt::Retry(why)),
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
            progress.retract(have);
            return Ok(Attempt::Retry("range not satisfiable; restarting".into()));
        }
        408 | 429 | 500..=599 => return Ok(Attempt::Retry(format!("HTTP {status}"))),
        _ => return Err(FetchError::SourceUnavailable(format!("{shown}: HTTP {status}"))),
    };
    if !append {
        progress.retract(have);
    }
    let mut size = if append { have } else { 0 };
    if let Some(len) = resp.content_length() {
        budget.check(size.saturating_add(len))?;
        // The file's whole length, told to the progress once per file (attempts may repeat it).
        if !*announced {
            progress.expect(size.saturating_add(len));
            *announced = true;
        }
    }
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
            Ok(Some(bytes)) => {
                size = size.saturating_add(bytes.len() as u64);
                budget.check(size)?;
                progress.add(bytes.len() as u64);
                file.write_all(&bytes)
                    .await
                    .map_err(FetchError::io(to.display().to_string()))?
            }
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
pub(crate) fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_only_to_its_origin() {
        let c = Credential::new("https://huggingface.co", Some("hf_secret")).unwrap();
        let url = |u: &str| Url::parse(u).unwrap();
        assert_eq!(
            c.token_for(&url("https://huggingface.co/org/m/resolve/main/x")),
            Some("hf_secret")
        );
        for other in [
            "https://evil.example/x",
            "https://huggingface.co.evil.example/x",
            "http://huggingface.co/x",
            "https://huggingface.co:8443/x",
            "https://cdn-lfs.huggingface.co/x",
        ] {
            assert_eq!(c.token_for(&url(other)), None, "{other}");
        }
        assert!(Credential::new("https://huggingface.co", Some("")).is_none());
        assert!(Credential::new("https://huggingface.co", None).is_none());
        assert!(format!("{c:?}").contains("redacted") && !format!("{c:?}").contains("hf_secret"));
    }

    #[test]
    fn redirects_only_to_https() {
        let from = Url::parse("https://huggingface.co/org/m/resolve/main/x").unwrap();
        let check = |loc: &str, want: Result<&str, &str>| match (redirect_target(&from, loc), want) {
            (Ok(u), Ok(w)) => assert_eq!(u.as_str(), w, "{loc}"),
            (Err(e), Err(w)) => assert!(e.contains(w), "{loc}: {e}"),
            (got, want) => panic!("{loc}: got {got:?}, want {want:?}"),
        };
        check(
            "https://cdn.example/blob?sig=1",
            Ok("https://cdn.example/blob?sig=1"),
        );
        check("/api/other", Ok("https://huggingface.co/api/other"));
        check("http://cdn.example/blob", Err("http:// URL refused"));
        check("file:///etc/passwd", Err("file:// URL refused"));
        let plain = Url::parse("http://127.0.0.1:9/x").unwrap();
        assert!(
            redirect_target(&plain, "/y").is_err(),
            "a relative hop stays http"
        );
    }
}
