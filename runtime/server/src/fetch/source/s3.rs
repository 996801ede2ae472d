//! `s3://bucket/prefix`: a model in an S3 bucket or an S3-compatible store (`--s3-endpoint`, path-style
//! addressing with `--s3-path-style`), read with `object_store`: the objects under `prefix/` (a
//! directory) or the one object `prefix` names (a single `.gguf`), each fetched by parallel `Range`
//! GETs of [`CHUNK`] bytes into its place in the staging tree.
//!
//! Credentials, in order: keys from the credentials directory (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` files of the mounted Secret), else what the pod's
//! environment provides (`AWS_*` variables, a web-identity token — IRSA — or the instance metadata).
//! Resumable: with a node cache, each object is assembled in `cache/.s3/<etag>-<size>.partial`
//! beside a `.done` list of the chunks already written, so a restarted fetch asks only for the rest
//! (an object that changed has another ETag and starts over).
//!
//! Invariants: object keys become relative paths only if they are safe ([`super::safe_relative`]); a
//! chunk is accepted only with exactly the bytes asked for; the secret key is never formatted into a
//! message (errors carry the bucket and key, `object_store`'s text without credentials).

use super::super::limits::Budget;
use super::super::progress::Progress;
use super::super::{FetchError, FetchRequest};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use std::fmt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes per ranged GET.
pub const CHUNK: u64 = 16 << 20;
/// Ranged GETs in flight at once (all objects together).
pub const PARALLEL: usize = 8;

/// A bucket and a key prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Path {
    /// The bucket.
    pub bucket: String,
    /// The object, or the "directory" of objects (without a trailing `/`; empty: the whole bucket).
    pub prefix: String,
}

/// How to reach the store: endpoint, region, addressing, and static keys (redacted from `Debug`).
#[derive(Clone, Default)]
pub struct S3Access {
    /// The endpoint of an S3-compatible store; AWS's when `None`.
    pub endpoint: Option<String>,
    /// The region (default `us-east-1`).
    pub region: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`).
    pub path_style: bool,
    /// `(access key id, secret access key, session token)` from the credentials directory.
    pub keys: Option<(String, String, Option<String>)>,
}

impl fmt::Debug for S3Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Access")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("keys", &self.keys.as_ref().map(|k| (&k.0, "<redacted>")))
            .finish()
    }
}

impl S3Access {
    /// Keys from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) files in `dir`.
    pub fn read_keys(dir: &Path) -> Result<Option<(String, String, Option<String>)>, FetchError> {
        let read = |name: &str| -> Result<Option<String>, FetchError> {
            let p = dir.join(name);
            if !p.is_file() {
                return Ok(None);
            }
            std::fs::read_to_string(&p)
                .map(|s| Some(s.trim().to_string()))
                .map_err(FetchError::io(format!("reading {}", p.display())))
        };
        match (read("AWS_ACCESS_KEY_ID")?, read("AWS_SECRET_ACCESS_KEY")?) {
            (Some(id), Some(secret)) => Ok(Some((id, secret, read("AWS_SESSION_TOKEN")?))),
            (None, None) => Ok(None),
            _ => Err(FetchError::InvalidArgument(format!(
                "credentials {}: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together",
                dir.display()
            ))),
        }
    }
}

impl S3Path {
    /// Parses what follows `s3://`.
    pub fn parse(rest: &str, invalid: impl Fn(&str) -> FetchError) -> Result<S3Path, FetchError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid_bucket {
            return Err(invalid(
                "expected s3://bucket/prefix (a bucket name: 3-63 of a-z 0-9 . -)",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() && super::safe_relative(prefix).is_none() {
            return Err(invalid("the key prefix must be a relative path without '..'"));
        }
        Ok(S3Path {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// `s3://bucket/prefix`.
    pub fn display(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// Fetches the object (or every object under the prefix) into `staging`, within `budget`.
    pub async fn download_into(
        &self,
        staging: &Path,
        req: &FetchRequest,
        budget: &mut Budget,
    ) -> Result<(), FetchError> {
        let store: Arc<dyn ObjectStore> = Arc::new(self.store(&req.access.s3)?);
        let objects = self.objects(store.as_ref()).await?;
        let total: u64 = objects.iter().map(|o| o.size).sum();
        budget.check(total)?;
        req.progress.expect(total);
        let mut chunks = Vec::new();
        for o in &objects {
            let file = Target::open(o, staging, req.cache.as_deref())?;
            let file = Arc::new(file);
            for index in 0..o.size.div_ceil(CHUNK) {
                if !file.done(index) {
                    chunks.push((o.clone(), file.clone(), index));
                } else {
                    req.progress.add(chunk_len(o.size, index));
                }
            }
        }
        let shown = self.display();
        futures::stream::iter(chunks.into_iter().map(Ok))
            .try_for_each_concurrent(PARALLEL, |(o, file, index)| {
                let (store, progress, shown) = (store.clone(), req.progress.clone(), shown.clone());
                async move { get_chunk(store.as_ref(), &o, &file, index, &progress, &shown).await }
            })
            .await?;
        for o in &objects {
            Target::finish(o, staging, req.cache.as_deref())?;
        }
        budget.spend(total)
    }

    fn store(&self, access: &S3Access) -> Result<object_store::aws::AmazonS3, FetchError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_region(access.region.clone().unwrap_or_else(|| "us-east-1".into()))
            .with_virtual_hosted_style_request(!access.path_style)
            .with_retry(object_store::RetryConfig {
                max_retries: 5,
                ..Default::default()
            });
        if let Some(e) = &access.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        if let Some((id, secret, token)) = &access.keys {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(t) = token {
                b = b.with_token(t);
            }
        }
        b.build()
            .map_err(|e| FetchError::InvalidArgument(format!("{}: {}", self.display(), e)))
    }

    /// The object `prefix` names, or every object under `prefix/`, with its path in the model.
    async fn objects(&self, store: &dyn ObjectStore) -> Result<Vec<Object>, FetchError> {
        let shown = self.display();
        if !self.prefix.is_empty() {
            match store.head(&ObjectPath::from(self.prefix.as_str())).await {
                Ok(meta) => {
                    let name = self.prefix.rsplit('/').next().unwrap_or(&self.prefix).to_string();
                    return Ok(vec![Object::of(meta, name)]);
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(error(e, &shown)),
            }
        }
        let dir = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let metas: Vec<object_store::ObjectMeta> = store
            .list(dir.as_ref())
            .try_collect()
            .await
            .map_err(|e| error(e, &shown))?;
        let mut out = Vec::new();
        for meta in metas {
            let key = meta.location.to_string();
            let rel = key
                .strip_prefix(&self.prefix)
                .unwrap_or(&key)
                .trim_start_matches('/')
                .to_string();
            if super::safe_relative(&rel).is_none() {
                return Err(FetchError::Malformed(format!(
                    "{shown}: object key {key:?} is not a safe path"
                )));
            }
            out.push(Object::of(meta, rel));
        }
        if out.is_empty() {
            return Err(FetchError::SourceUnavailable(format!(
                "{shown}: no objects under it"
            )));
        }
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }
}

/// One object and where it goes.
#[derive(Clone, Debug)]
struct Object {
    location: ObjectPath,
    rel: String,
    size: u64,
    etag: Option<String>,
}

impl Object {
    fn of(meta: object_store::ObjectMeta, rel: String) -> Object {
        Object {
            location: meta.location,
            rel,
            size: meta.size,
            etag: meta.e_tag,
        }
    }
}

fn chunk_len(size: u64, index: u64) -> u64 {
    (size - index * CHUNK).min(CHUNK)
}

/// Maps a store error to a fetch error: refused credentials, a missing bucket or key, the rest.
fn error(e: object_store::Error, shown: &str) -> FetchError {
    match e {
        object_store::Error::Unauthenticated { .. } | object_store::Error::PermissionDenied { .. } => {
            FetchError::Unauthorized(format!(
                "{shown}: the store refused the credentials (check credentialsSecretRef or the pod's identity)"
            ))
        }
        object_store::Error::NotFound { path, .. } => {
            FetchError::SourceUnavailable(format!("{shown}: {path} not found"))
        }
        other => FetchError::SourceUnavailable(format!("{shown}: {}", one_line(&other))),
    }
}

fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s.replace('\n', " ")
}

/// Fetches chunk `index` of `o` into its place in `file`.
async fn get_chunk(
    store: &dyn ObjectStore,
    o: &Object,
    file: &Target,
    index: u64,
    progress: &Progress,
    shown: &str,
) -> Result<(), FetchError> {
    let start = index * CHUNK;
    let len = chunk_len(o.size, index);
    let bytes = store
        .get_range(&o.location, start..start + len)
        .await
        .map_err(|e| error(e, shown))?;
    if bytes.len() as u64 != len {
        return Err(FetchError::SourceUnavailable(format!(
            "{shown}: {} answered {} bytes for a range of {len}",
            o.location,
            bytes.len()
        )));
    }
    file.write_chunk(index, start, &bytes)?;
    progress.add(len);
    Ok(())
}

/// Where an object is assembled: its staging path, or (with a node cache) a `.partial` file kept
/// with a list of the chunks already written, moved into staging when complete.
struct Target {
    file: std::fs::File,
    path: PathBuf,
    done_list: Option<std::sync::Mutex<std::fs::File>>,
    done: std::collections::BTreeSet<u64>,
}

impl Target {
    fn partial_path(o: &Object, cache: &Path) -> Option<PathBuf> {
        let etag = o.etag.as_deref()?.trim_matches('"');
        let safe = etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        safe.then(|| cache.join(".s3").join(format!("{etag}-{}.partial", o.size)))
    }

    fn open(o: &Object, staging: &Path, cache: Option<&Path>) -> Result<Target, FetchError> {
        let io = |p: &Path| FetchError::io(format!("writing {}", p.display()));
        let dest = staging.join(&o.rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let partial = cache.and_then(|c| Self::partial_path(o, c));
        let Some(path) = partial.filter(|p| p.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok()))
        else {
            let file = std::fs::File::create(&dest).map_err(io(&dest))?;
            file.set_len(o.size).map_err(io(&dest))?;
            return Ok(Target {
                file,
                path: dest,
                done_list: None,
                done: Default::default(),
            });
        };
        let done_path = path.with_extension("done");
        let done: std::collections::BTreeSet<u64> = std::fs::read_to_string(&done_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        file.set_len(o.size).map_err(io(&path))?;
        let list = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&done_path)
            .map_err(io(&done_path))?;
        Ok(Target {
            file,
            path,
            done_list: Some(std::sync::Mutex::new(list)),
            done,
        })
    }

    fn done(&self, index: u64) -> bool {
        self.done.contains(&index)
    }

    fn write_chunk(&self, index: u64, at: u64, bytes: &[u8]) -> Result<(), FetchError> {
        let io = FetchError::io(format!("writing {}", self.path.display()));
        self.file.write_all_at(bytes, at).map_err(io)?;
        if let Some(list) = &self.done_list {
            // The chunk's bytes reach the file before its index reaches the list.
            self.file
                .sync_data()
                .map_err(FetchError::io(format!("syncing {}", self.path.display())))?;
            use std::io::Write;
            let mut l = list.lock().unwrap_or_else(|e| e.into_inner());
            writeln!(l, "{index}").map_err(FetchError::io(format!("writing {}", self.path.display())))?;
        }
        Ok(())
    }

    /// Moves a completed `.partial` into staging (nothing to do for an object written in place).
    fn finish(o: &Object, staging: &Path, cache: Option<&Path>) -> Result<(), FetchError> {
        let Some(partial) = cache
            .and_then(|c| Self::partial_path(o, c))
            .filter(|p| p.exists())
        else {
            return Ok(());
        };
        let dest = staging.join(&o.rel);
        let moved = std::fs::rename(&partial, &dest).or_else(|_| {
            std::fs::copy(&partial, &dest)
                .map(|_| ())
                .and_then(|()| std::fs::remove_file(&partial))
        });
        moved.map_err(FetchError::io(format!("placing {}", dest.display())))?;
        let _ = std::fs::remove_file(partial.with_extension("done"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<S3Path, String> {
        S3Path::parse(s, |w| FetchError::InvalidArgument(w.into())).map_err(|e| e.to_string())
    }

    #[test]
    fn buckets_and_prefixes() {
        let p = parse("models/smollm2/q4/").unwrap();
        assert_eq!((p.bucket.as_str(), p.prefix.as_str()), ("models", "smollm2/q4"));
        assert_eq!(p.display(), "s3://models/smollm2/q4");
        assert_eq!(parse("models").unwrap().prefix, "");
        assert!(parse("Models/x").unwrap_err().contains("bucket"));
        assert!(parse("ab/x").unwrap_err().contains("bucket"));
        assert!(parse("models/../x").unwrap_err().contains("relative"));
        let a = S3Access {
            keys: Some(("AKID".into(), "very-secret".into(), None)),
            ..Default::default()
        };
        assert!(!format!("{a:?}").contains("very-secret"));
    }

    #[test]
    fn chunks_cover_the_object() {
        assert_eq!(chunk_len(CHUNK * 2 + 5, 2), 5);
        assert_eq!(chunk_len(CHUNK, 0), CHUNK);
        assert_eq!((CHUNK * 2 + 5).div_ceil(CHUNK), 3);
    }
}
