//! `fetch` from `s3://` against a real S3 server: versitygw (Apache-2.0, `make setup` builds it from its
//! Go module; it checks SigV4 signatures), on a loopback port with a directory backend. Objects are
//! uploaded with `object_store` (the client `fetch` uses), then fetched: a model directory under a
//! prefix and a single object, chunked into parallel range GETs; a resume from a `.partial` in the node
//! cache that asks only for the missing chunks; and the refusals — wrong keys, a missing bucket, an
//! empty prefix — each with its reason.

use modelfleet_runtime::digest::digest_path;
use modelfleet_runtime::fetch::source::s3::{CHUNK, S3Access};
use modelfleet_runtime::fetch::{Access, FetchRequest, Fetched, Source, fetch};
use object_store::{ObjectStoreExt, PutPayload};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ACCESS: &str = "modelfleet-test";
const SECRET: &str = "modelfleet-test-secret-key";

/// The versitygw binary `e2e/scripts/build-tools.sh` built (its cache directory from versions.sh).
fn versitygw() -> PathBuf {
    if let Some(p) = std::env::var_os("MODELFLEET_VERSITYGW") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg("-c")
        .arg("source e2e/scripts/versions.sh && echo \"$MF_TOOLS_BIN/versitygw\"")
        .current_dir(root)
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A running S3 server; killed when dropped.
struct S3Server {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl S3Server {
    fn start() -> S3Server {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bin = versitygw();
        assert!(
            bin.exists(),
            "{} is missing: run e2e/scripts/build-tools.sh (make setup)",
            bin.display()
        );
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let child = Command::new(bin)
            .args([
                "--access",
                ACCESS,
                "--secret",
                SECRET,
                "--port",
                &format!("127.0.0.1:{port}"),
                "posix",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "versitygw did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    fn access(&self, secret: &str) -> Access {
        Access {
            s3: S3Access {
                endpoint: Some(self.endpoint.clone()),
                region: Some("us-east-1".into()),
                path_style: true,
                keys: Some((ACCESS.into(), secret.into(), None)),
            },
            ..Access::default()
        }
    }

    fn store(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        let _ = rustls::crypto::ring::default_provider().install_default();
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id(ACCESS)
            .with_secret_access_key(SECRET)
            .with_virtual_hosted_style_request(false)
            .build()
            .unwrap()
    }

    /// Creates `bucket` and uploads `files` (key, bytes) with object_store.
    async fn upload(&self, bucket: &str, files: &[(String, Vec<u8>)]) {
        // CreateBucket: object_store has no call for it, and the posix backend's bucket is a directory
        // under its root (versitygw's documented layout).
        std::fs::create_dir_all(self._dir.path().join("data").join(bucket)).unwrap();
        let store = self.store(bucket);
        for (key, bytes) in files {
            store
                .put(
                    &object_store::path::Path::from(key.as_str()),
                    PutPayload::from(bytes.clone()),
                )
                .await
                .unwrap();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn weights(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 253) as u8).collect()
}

fn model_files(prefix: &str) -> Vec<(String, Vec<u8>)> {
    vec![
        (
            format!("{prefix}/config.json"),
            br#"{"architectures":["LlamaForCausalLM"]}"#.to_vec(),
        ),
        (format!("{prefix}/tokenizer.json"), br#"{"model":{}}"#.to_vec()),
        // Three chunks and a bit: parallel ranged GETs put it together.
        (
            format!("{prefix}/model.safetensors"),
            weights(3 * CHUNK as usize + 12_345),
        ),
    ]
}

fn local_copy(files: &[(String, Vec<u8>)], prefix: &str, root: &Path) -> PathBuf {
    for (key, bytes) in files {
        let p = root.join(key.strip_prefix(&format!("{prefix}/")).unwrap());
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    root.to_path_buf()
}

fn request(s3: &S3Server, uri: &str, digest: &str, dest: &Path, secret: &str) -> FetchRequest {
    FetchRequest {
        access: s3.access(secret),
        ..FetchRequest::new(Source::parse(uri).unwrap(), digest, dest)
    }
}

#[tokio::test]
async fn a_model_under_a_prefix_and_a_single_object() {
    let s3 = S3Server::start();
    let files = model_files("smollm/v1");
    let mut all = files.clone();
    all.push(("ggufs/tiny.gguf".into(), weights(40_000)));
    s3.upload("models", &all).await;
    let t = tempfile::tempdir().unwrap();
    let want = digest_path(&local_copy(&files, "smollm/v1", &t.path().join("expected"))).unwrap();
    let dest = t.path().join("dest");
    let how = fetch(&request(&s3, "s3://models/smollm/v1/", &want, &dest, SECRET))
        .await
        .unwrap();
    assert_eq!(how, Fetched::FromSource);
    assert_eq!(digest_path(&dest).unwrap(), want);
    // One object: it lands under its own name.
    let single = t.path().join("single");
    let gguf = t.path().join("tiny.gguf");
    std::fs::write(&gguf, weights(40_000)).unwrap();
    let d = digest_path(&gguf).unwrap();
    fetch(&request(&s3, "s3://models/ggufs/tiny.gguf", &d, &single, SECRET))
        .await
        .unwrap();
    assert_eq!(std::fs::read(single.join("tiny.gguf")).unwrap(), weights(40_000));
}

#[tokio::test]
async fn a_partial_object_in_the_node_cache_resumes_at_its_missing_chunks() {
    let s3 = S3Server::start();
    let files = model_files("m");
    s3.upload("resume", &files).await;
    let t = tempfile::tempdir().unwrap();
    let want = digest_path(&local_copy(&files, "m", &t.path().join("expected"))).unwrap();
    let meta = s3
        .store("resume")
        .head(&object_store::path::Path::from("m/model.safetensors"))
        .await
        .unwrap();
    let etag = meta.e_tag.clone().expect("versitygw gives ETags");
    let weights = &files[2].1;
    // An earlier fetch on this node wrote chunks 0 and 1 and recorded them; `good` decides whether
    // their bytes are right.
    let partial = |cache: &Path, good: bool| {
        let dir = cache.join(".s3");
        std::fs::create_dir_all(&dir).unwrap();
        let name = format!("{}-{}", etag.trim_matches('"'), weights.len());
        let mut bytes = weights[..2 * CHUNK as usize].to_vec();
        if !good {
            bytes[0] ^= 0xff;
        }
        std::fs::write(dir.join(format!("{name}.partial")), bytes).unwrap();
        std::fs::write(dir.join(format!("{name}.done")), "0\n1\n").unwrap();
    };
    // The recorded chunks are kept, not asked for again: wrong bytes there reach the digest check.
    let bad_cache = t.path().join("bad");
    partial(&bad_cache, false);
    let mut req = request(&s3, "s3://resume/m", &want, &t.path().join("a"), SECRET);
    req.cache = Some(bad_cache);
    assert_eq!(fetch(&req).await.unwrap_err().reason(), "DigestMismatch");
    // With the right bytes the fetch completes from the two chunks it had plus the rest.
    let cache = t.path().join("good");
    partial(&cache, true);
    let mut req = request(&s3, "s3://resume/m", &want, &t.path().join("b"), SECRET);
    req.cache = Some(cache.clone());
    fetch(&req).await.unwrap();
    assert_eq!(digest_path(&t.path().join("b")).unwrap(), want);
    let p = req.progress.snapshot();
    assert_eq!(
        (p.bytes, p.expected_bytes),
        (p.expected_bytes, files.iter().map(|f| f.1.len() as u64).sum())
    );
    assert!(
        !cache.join(".s3").read_dir().unwrap().any(|_| true),
        "the partial moved into place"
    );
}

#[tokio::test]
async fn refusals_name_the_problem() {
    let s3 = S3Server::start();
    s3.upload("refusals", &model_files("m")).await;
    let t = tempfile::tempdir().unwrap();
    let d = format!("sha256:{}", "a".repeat(64));
    let err = |uri: &str, secret: &str, dest: &str| {
        let req = request(&s3, uri, &d, &t.path().join(dest), secret);
        async move { fetch(&req).await.unwrap_err() }
    };
    let e = err("s3://refusals/m", "wrong-secret", "a").await;
    assert_eq!(e.reason(), "Unauthorized", "{e}");
    assert!(!e.to_string().contains("wrong-secret"), "{e}");
    let e = err("s3://no-such-bucket/m", SECRET, "b").await;
    assert_eq!(e.reason(), "SourceUnavailable", "{e}");
    let e = err("s3://refusals/nothing-here", SECRET, "c").await;
    assert_eq!(e.reason(), "SourceUnavailable", "{e}");
    let e = err("s3://refusals/m", SECRET, "d").await;
    assert_eq!(e.reason(), "DigestMismatch", "{e}");
    for dest in ["a", "b", "c", "d"] {
        assert!(!t.path().join(dest).exists(), "{dest}: nothing written");
    }
}
