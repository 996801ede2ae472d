//! Pushes a packaged artifact with `oci_client`: each blob the registry lacks (streamed from disk, a
//! tar layer generated on the fly by a blocking thread), then the config, then the manifest under the
//! tag (or only by digest).
//!
//! Invariants: a blob the registry already has is not sent again (`HEAD` first), so re-packaging a
//! model moves only what changed; the manifest goes last, so a reference never names missing blobs;
//! the registry's answer for the manifest must be the digest computed here.

use super::artifact::{Artifact, Blob, Body};
use super::plan::{self, Model};
use crate::fetch::FetchError;
use crate::fetch::source::oci::{OciRef, client};
use bytes::Bytes;
use futures::Stream;
use oci_client::errors::OciDistributionError;
use std::io::Write;

/// Pushes `a` to `target` (its tag, if any, names the manifest).
pub async fn push(
    oci: &oci_client::Client,
    target: &OciRef,
    model: &Model,
    a: &Artifact,
) -> Result<(), FetchError> {
    let reference = target.client_ref();
    let shown = target.display();
    for blob in a.layers.iter().chain(std::iter::once(&a.config)) {
        let exists = oci
            .blob_exists(&reference, &blob.digest)
            .await
            .map_err(|e| client::error(e, &shown, &format!("blob {}", blob.digest)))?;
        if exists {
            eprintln!("package: {} already in the registry", blob.digest);
            continue;
        }
        eprintln!(
            "package: pushing {} ({} bytes, {})",
            blob.digest, blob.size, blob.media_type
        );
        oci.push_blob_stream(&reference, body(blob, model), &blob.digest, Some(blob.size))
            .await
            .map_err(|e| client::error(e, &shown, &format!("pushing blob {}", blob.digest)))?;
    }
    let by = match &target.tag {
        Some(tag) => {
            oci_client::Reference::with_tag(target.registry.clone(), target.repository.clone(), tag.clone())
        }
        None => oci_client::Reference::with_digest(
            target.registry.clone(),
            target.repository.clone(),
            a.manifest_digest.clone(),
        ),
    };
    let content_type =
        reqwest::header::HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json");
    let url = oci
        .push_manifest_raw(&by, a.manifest.clone(), content_type)
        .await
        .map_err(|e| client::error(e, &shown, "pushing the manifest"))?;
    eprintln!("package: manifest {} at {url}", a.manifest_digest);
    Ok(())
}

/// The blob's bytes as a stream: a file read in 1 MiB chunks, a tar layer written by a blocking
/// thread into a bounded channel, or bytes in memory.
fn body(
    blob: &Blob,
    model: &Model,
) -> impl Stream<Item = Result<Bytes, OciDistributionError>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let (b, files) = (blob.body.clone(), model.files.clone());
    let digests = Model {
        files,
        digest: model.digest.clone(),
    };
    tokio::task::spawn_blocking(move || {
        let mut w = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let result = match b {
            Body::Bytes(bytes) => w.write_all(&bytes),
            Body::File(path) => {
                std::fs::File::open(&path).and_then(|mut f| std::io::copy(&mut f, &mut w).map(|_| ()))
            }
            Body::Tar(layer) => plan::write_tar_layer(&layer, &digests, &mut w, plan::source_date_epoch()),
        }
        .and_then(|()| w.flush());
        if let Err(e) = result {
            let _ = tx.blocking_send(Err(e));
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|item| (item.map_err(OciDistributionError::IoError), rx))
    })
}

const CHUNK: usize = 1 << 20;

/// A `Write` that sends full chunks into a channel (blocking while the uploader is behind).
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let take = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..take]);
        if self.buf.len() == CHUNK {
            self.flush()?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::other("the upload stopped"))
    }
}
