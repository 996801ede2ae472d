//! `http(s)://host/path/file`: one file over HTTP(S), landing under the last path segment of the URL,
//! downloaded through [`download`] (retries, `Range` resume, redirects only to https).
//!
//! Invariants: the URL's path must end in a plain file name; credentials in the URL (user info, query)
//! never appear in messages ([`display`]).

use super::super::limits::Budget;
use super::super::{FetchError, FetchRequest, download};
use reqwest::Url;
use std::path::Path;

/// Parses an `http://` or `https://` URI.
pub fn parse(uri: &str, invalid: impl Fn(&str) -> FetchError) -> Result<Url, FetchError> {
    let url = Url::parse(uri).map_err(|e| invalid(&e.to_string()))?;
    file_name_of(&url).ok_or_else(|| invalid("the URL path must end in a file name"))?;
    Ok(url)
}

/// The URL without user info or query (which may carry credentials).
pub fn display(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.to_string()
}

/// Downloads the file into `staging/<file name>`, within `budget`.
pub async fn download_into(
    url: &Url,
    staging: &Path,
    req: &FetchRequest,
    budget: &mut Budget,
) -> Result<(), FetchError> {
    let access = &req.access;
    let cred = download::Credential::new(&access.hf_endpoint, access.hf_token.as_deref());
    let name = file_name_of(url).expect("checked when parsed");
    let client = download::client(access.ca_file.as_deref())?;
    let to = staging.join(name);
    download::download(
        &client,
        url,
        &to,
        cred.as_ref(),
        budget,
        &display(url),
        &req.progress,
    )
    .await
}

/// The last non-empty path segment of a URL, if it is a plain file name.
fn file_name_of(url: &Url) -> Option<String> {
    let name = url.path_segments()?.next_back()?.to_string();
    (!name.is_empty() && name != "." && name != "..").then_some(name)
}
