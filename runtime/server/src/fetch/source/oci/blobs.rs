//! Layer blobs: pulled from the registry a few at a time into a blob directory, each streamed to disk,
//! hashed as it arrives, resumed with a `Range` request after an interruption, and kept only if it has
//! exactly the size and digest its descriptor names.
//!
//! Invariants: a blob file whose name is `sha256-<hex>` holds exactly those bytes (a download in
//! progress is `sha256-<hex>.partial`, renamed only after its digest checked); more bytes than the
//! descriptor's size are never written (a registry that streams on is cut off); retries are bounded.

use super::super::super::progress::Progress;
use super::super::super::{FetchError, download};
use super::client;
use super::reference::OciRef;
use futures::{StreamExt, TryStreamExt};
use oci_client::client::BlobResponse;
use oci_client::manifest::OciDescriptor;
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Blobs pulled side by side.
pub const PARALLEL: usize = 4;

/// The file a verified blob lives in.
pub fn blob_path(dir: &Path, digest: &str) -> PathBuf {
    dir.join(digest.replace(':', "-"))
}

/// Pulls every descriptor's blob into `dir` (those already there, verified, are kept), side by side.
pub async fn pull_all(
    client: &oci_client::Client,
    r: &OciRef,
    layers: &[OciDescriptor],
    dir: &Path,
    progress: &Progress,
) -> Result<(), FetchError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(FetchError::io(format!("creating {}", dir.display())))?;
    futures::stream::iter(layers.iter().map(Ok))
        .try_for_each_concurrent(PARALLEL, |l| pull_one(client, r, l, dir, progress))
        .await
}

/// Pulls one blob, resuming a `.partial` file left by an earlier attempt or process.
async fn pull_one(
    client: &oci_client::Client,
    r: &OciRef,
    layer: &OciDescriptor,
    dir: &Path,
    progress: &Progress,
) -> Result<(), FetchError> {
    let done = blob_path(dir, &layer.digest);
    let size = layer.size as u64;
    if tokio::fs::metadata(&done).await.is_ok_and(|m| m.len() == size) {
        progress.add(size);
        return Ok(());
    }
    let partial = done.with_extension("partial");
    let shown = r.display();
    let what = format!("blob {}", layer.digest);
    let (mut last, mut counted) = (String::new(), 0u64);
    for attempt in 0..download::MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(download::FIRST_BACKOFF * 2u32.pow(attempt - 1)).await;
        }
        match attempt_once(client, r, layer, &partial, (progress, &mut counted)).await {
            Ok(hash) if hash == layer.digest => {
                return tokio::fs::rename(&partial, &done)
                    .await
                    .map_err(FetchError::io(format!("renaming {}", partial.display())));
            }
            Ok(hash) => {
                let _ = tokio::fs::remove_file(&partial).await;
                progress.retract(counted);
                return Err(FetchError::DigestMismatch {
                    uri: format!("{shown} ({what})"),
                    expected: layer.digest.clone(),
                    actual: hash,
                });
            }
            Err(Pull::Fatal(e)) => return Err(e),
            Err(Pull::Transient(why)) => last = why,
        }
    }
    Err(FetchError::SourceUnavailable(format!(
        "{shown}: {what}: giving up after {} attempts: {last}",
        download::MAX_ATTEMPTS
    )))
}

enum Pull {
    Fatal(FetchError),
    Transient(String),
}

/// One request for the rest of the blob; returns the digest of the whole `.partial` file. `counted`
/// is how many of this blob's bytes the progress holds (kept equal to the file's length).
async fn attempt_once(
    client: &oci_client::Client,
    r: &OciRef,
    layer: &OciDescriptor,
    partial: &Path,
    (progress, counted): (&Progress, &mut u64),
) -> Result<String, Pull> {
    let io = |what: &str| {
        let what = format!("{what} {}", partial.display());
        move |e| Pull::Fatal(FetchError::io(what)(e))
    };
    let size = layer.size as u64;
    let have = tokio::fs::metadata(partial).await.map(|m| m.len()).unwrap_or(0);
    let have = if have > size { 0 } else { have };
    let response = client
        .pull_blob_stream_partial(&r.client_ref(), layer, have, None)
        .await
        .map_err(|e| classify(e, r, layer))?;
    let (mut stream, append) = match response {
        BlobResponse::Full(s) => (s, false),
        BlobResponse::Partial(s) => (s, have > 0),
    };
    let mut hasher = Sha256::new();
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(!append)
        .open(partial)
        .await
        .map_err(io("opening"))?;
    let mut written = if append {
        hash_prefix(&mut file, &mut hasher).await.map_err(io("reading"))?
    } else {
        0
    };
    // The bytes on disk (a resumed file may come from an earlier process) are what progress shows.
    if written >= *counted {
        progress.add(written - *counted);
    } else {
        progress.retract(*counted - written);
    }
    *counted = written;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                file.flush().await.map_err(io("writing"))?;
                return Err(Pull::Transient(format!("body interrupted: {e}")));
            }
        };
        written += chunk.len() as u64;
        if written > size {
            return Err(Pull::Fatal(FetchError::SourceUnavailable(format!(
                "{}: blob {} is longer than the {size} bytes its descriptor says",
                r.display(),
                layer.digest
            ))));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(io("writing"))?;
        progress.add(chunk.len() as u64);
        *counted += chunk.len() as u64;
    }
    file.flush().await.map_err(io("writing"))?;
    if written < size {
        return Err(Pull::Transient(format!(
            "body ended at {written} of {size} bytes"
        )));
    }
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// Feeds the bytes already in `file` to `hasher`; leaves the cursor at the end; returns their count.
async fn hash_prefix(file: &mut tokio::fs::File, hasher: &mut Sha256) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok(total);
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
}

/// A failed request: refusals and missing blobs are final; everything else may pass on a retry.
fn classify(e: oci_client::errors::OciDistributionError, r: &OciRef, layer: &OciDescriptor) -> Pull {
    let mapped = client::error(e, &r.display(), &format!("blob {}", layer.digest));
    match mapped {
        FetchError::SourceUnavailable(why) if !why.contains("not found") => Pull::Transient(why),
        other => Pull::Fatal(other),
    }
}
