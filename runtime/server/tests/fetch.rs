//! `fetch` against real sources: local files, and a local HTTP server that serves plain files, fails
//! transiently, cuts bodies short (resume with `Range`), and serves the Hugging Face Hub layout; the
//! byte and time limits; and where credentials go, with redirects to a local https listener and to
//! another plain-http origin.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use modelfleet_runtime::digest::digest_path;
use modelfleet_runtime::fetch::{Access, FetchError, FetchRequest, Fetched, Limits, Source, fetch};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const TOKEN: &str = "hf-test-secret";

#[derive(Default)]
struct Server {
    files: HashMap<String, Vec<u8>>,
    flaky_failures: AtomicUsize,
    cut_once: Mutex<bool>,
    range_requests: AtomicUsize,
    requests: AtomicUsize,
}

fn with_range(bytes: &[u8], headers: &HeaderMap, server: &Server) -> Response {
    if let Some(range) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        server.range_requests.fetch_add(1, Ordering::SeqCst);
        let start: usize = range
            .trim_start_matches("bytes=")
            .trim_end_matches('-')
            .parse()
            .unwrap();
        if start >= bytes.len() {
            return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
        }
        let content_range = format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len());
        return (
            StatusCode::PARTIAL_CONTENT,
            [(header::CONTENT_RANGE, content_range)],
            bytes[start..].to_vec(),
        )
            .into_response();
    }
    bytes.to_vec().into_response()
}

async fn plain(State(s): State<Arc<Server>>, UrlPath(name): UrlPath<String>, h: HeaderMap) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    match s.files.get(&name) {
        Some(bytes) => with_range(bytes, &h, &s),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn flaky(State(s): State<Arc<Server>>, UrlPath(name): UrlPath<String>, h: HeaderMap) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    if s.flaky_failures.load(Ordering::SeqCst) > 0 {
        s.flaky_failures.fetch_sub(1, Ordering::SeqCst);
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    with_range(&s.files[&name], &h, &s)
}

async fn cut(State(s): State<Arc<Server>>, UrlPath(name): UrlPath<String>, h: HeaderMap) -> Response {
    let bytes = s.files[&name].clone();
    let first = std::mem::replace(&mut *s.cut_once.lock().unwrap(), false);
    if first {
        let half = Bytes::from(bytes[..bytes.len() / 2].to_vec());
        return Response::builder()
            .header(header::CONTENT_LENGTH, bytes.len())
            .body(Body::from_stream(HalfThenError::new(half)))
            .unwrap();
    }
    with_range(&bytes, &h, &s)
}

/// A body stream that yields its bytes, waits (so they reach the client), then fails: the connection is
/// cut mid-transfer.
struct HalfThenError(u8, Option<Bytes>, std::pin::Pin<Box<tokio::time::Sleep>>);

impl HalfThenError {
    fn new(first: Bytes) -> Self {
        HalfThenError(
            0,
            Some(first),
            Box::pin(tokio::time::sleep(std::time::Duration::from_millis(200))),
        )
    }
}

impl futures_core::Stream for HalfThenError {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        if self.0 == 0 {
            self.0 = 1;
            return Poll::Ready(self.1.take().map(Ok));
        }
        if self.0 == 1 {
            if self.2.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.0 = 2;
            return Poll::Ready(Some(Err(std::io::Error::other(
                "connection cut by the test server",
            ))));
        }
        Poll::Ready(None)
    }
}

async fn hf_info(
    State(s): State<Arc<Server>>,
    UrlPath((org, repo, rev)): UrlPath<(String, String, String)>,
    h: HeaderMap,
) -> Response {
    if h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    assert_eq!((org.as_str(), repo.as_str(), rev.as_str()), ("org", "tiny", "v1"));
    let siblings: Vec<_> = s
        .files
        .keys()
        .filter_map(|k| k.strip_prefix("hf/"))
        .map(|f| serde_json::json!({ "rfilename": f }))
        .collect();
    axum::Json(serde_json::json!({ "id": "org/tiny", "sha": "abc", "siblings": siblings })).into_response()
}

async fn hf_file(
    State(s): State<Arc<Server>>,
    UrlPath((_org, _repo, _rev, file)): UrlPath<(String, String, String, String)>,
    h: HeaderMap,
) -> Response {
    if h.get(header::AUTHORIZATION).is_none() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    match s.files.get(&format!("hf/{file}")) {
        Some(bytes) => with_range(bytes, &h, &s),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn start(server: Arc<Server>) -> String {
    let app = Router::new()
        .route("/files/{name}", get(plain))
        .route("/flaky/{name}", get(flaky))
        .route("/cut/{name}", get(cut))
        .route("/api/models/{org}/{repo}/revision/{rev}", get(hf_info))
        .route("/{org}/{repo}/resolve/{rev}/{*file}", get(hf_file))
        .with_state(server);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn model_tree(root: &Path) {
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::write(root.join("config.json"), b"{\"hidden_size\": 64}").unwrap();
    fs::write(root.join("model.safetensors"), vec![7u8; 100_000]).unwrap();
    fs::write(root.join("sub/tokenizer.json"), b"{}").unwrap();
}

fn request(uri: &str, digest: &str, dest: &Path) -> FetchRequest {
    FetchRequest::new(Source::parse(uri).unwrap(), digest, dest)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect(),
        Err(_) => return vec!["<missing>".into()],
    };
    names.sort();
    names
}

#[tokio::test]
async fn file_directory_verifies_then_lands_and_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    model_tree(&src);
    let digest = digest_path(&src).unwrap();
    let dest = tmp.path().join("out/model");
    let req = request(&format!("file://{}", src.display()), &digest, &dest);
    assert_eq!(fetch(&req).await.unwrap(), Fetched::FromSource);
    assert_eq!(digest_path(&dest).unwrap(), digest);
    assert_eq!(
        entries(&tmp.path().join("out")),
        ["model"],
        "no staging leftovers"
    );
    assert_eq!(fetch(&req).await.unwrap(), Fetched::AlreadyPresent);
}

#[tokio::test]
async fn a_flipped_byte_is_refused_and_dest_is_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    model_tree(&src);
    let digest = digest_path(&src).unwrap();
    let mut bytes = fs::read(src.join("model.safetensors")).unwrap();
    bytes[4242] ^= 1;
    fs::write(src.join("model.safetensors"), bytes).unwrap();

    // DEST absent: it stays absent. DEST an existing (empty) directory: it stays empty.
    for (dest, existed) in [
        (tmp.path().join("absent"), false),
        (tmp.path().join("empty"), true),
    ] {
        if existed {
            fs::create_dir(&dest).unwrap();
        }
        let err = fetch(&request(&format!("file://{}", src.display()), &digest, &dest))
            .await
            .unwrap_err();
        match &err {
            FetchError::DigestMismatch { expected, actual, .. } => {
                assert_eq!(expected, &digest);
                assert_ne!(actual, &digest);
            }
            other => panic!("expected a digest mismatch, got {other}"),
        }
        assert!(
            err.termination_message()
                .starts_with("DigestMismatch: digest mismatch for file://")
        );
        assert_eq!(dest.exists(), existed);
        if existed {
            assert!(entries(&dest).is_empty());
        }
    }
    assert_eq!(entries(tmp.path()), ["empty", "src"], "no staging leftovers");
}

#[tokio::test]
async fn http_single_file_with_retries_and_resume() {
    let mut files = HashMap::new();
    let gguf: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
    files.insert("model.gguf".to_string(), gguf.clone());
    let server = Arc::new(Server {
        files,
        flaky_failures: AtomicUsize::new(2),
        ..Default::default()
    });
    *server.cut_once.lock().unwrap() = true;
    let base = start(server.clone()).await;

    let tmp = tempfile::tempdir().unwrap();
    let single = tmp.path().join("model.gguf");
    fs::write(&single, &gguf).unwrap();
    let digest = digest_path(&single).unwrap();

    // 503, 503, then the file.
    let dest = tmp.path().join("flaky");
    fetch(&request(&format!("{base}/flaky/model.gguf"), &digest, &dest))
        .await
        .unwrap();
    assert_eq!(fs::read(dest.join("model.gguf")).unwrap(), gguf);
    assert_eq!(server.flaky_failures.load(Ordering::SeqCst), 0);

    // The body is cut half-way; the second attempt asks for the rest with Range.
    let dest = tmp.path().join("cut");
    fetch(&request(&format!("{base}/cut/model.gguf"), &digest, &dest))
        .await
        .unwrap();
    assert_eq!(fs::read(dest.join("model.gguf")).unwrap(), gguf);
    assert!(
        server.range_requests.load(Ordering::SeqCst) >= 1,
        "the download was not resumed"
    );

    // A 404 is final: no retries.
    let before = server.requests.load(Ordering::SeqCst);
    let err = fetch(&request(
        &format!("{base}/files/missing.gguf"),
        &digest,
        &tmp.path().join("x"),
    ))
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "SourceUnavailable", "{err}");
    assert_eq!(server.requests.load(Ordering::SeqCst) - before, 1);
}

#[tokio::test]
async fn hugging_face_layout_with_token() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    model_tree(&src);
    let digest = digest_path(&src).unwrap();
    let mut files = HashMap::new();
    for rel in ["config.json", "model.safetensors", "sub/tokenizer.json"] {
        files.insert(format!("hf/{rel}"), fs::read(src.join(rel)).unwrap());
    }
    let base = start(Arc::new(Server {
        files,
        ..Default::default()
    }))
    .await;

    let dest = tmp.path().join("hf");
    let mut req = request("hf://org/tiny@v1", &digest, &dest);
    req.access.hf_endpoint = base;
    let err = fetch(&req).await.unwrap_err();
    assert!(err.to_string().contains("HTTP 401"), "{err}");
    assert!(!dest.exists());

    req.access.hf_token = Some(TOKEN.into());
    assert_eq!(fetch(&req).await.unwrap(), Fetched::FromSource);
    assert_eq!(digest_path(&dest).unwrap(), digest);
}

#[tokio::test]
async fn cache_is_reused_reverified_and_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    model_tree(&src);
    let digest = digest_path(&src).unwrap();
    let cache = tmp.path().join("cache");
    let uri = format!("file://{}", src.display());
    let with_cache = |dest: PathBuf| FetchRequest {
        cache: Some(cache.clone()),
        ..request(&uri, &digest, &dest)
    };

    assert_eq!(
        fetch(&with_cache(tmp.path().join("a"))).await.unwrap(),
        Fetched::FromSource
    );
    let entry = cache.join(digest.replace(':', "-"));
    assert_eq!(digest_path(&entry).unwrap(), digest);
    assert_eq!(
        fetch(&with_cache(tmp.path().join("b"))).await.unwrap(),
        Fetched::FromCache
    );
    assert_eq!(digest_path(&tmp.path().join("b")).unwrap(), digest);

    // A corrupted entry is detected, dropped and fetched again from the source.
    fs::remove_file(entry.join("config.json")).unwrap();
    fs::write(entry.join("config.json"), b"{\"hidden_size\": 65}").unwrap();
    assert_eq!(
        fetch(&with_cache(tmp.path().join("c"))).await.unwrap(),
        Fetched::FromSource
    );
    assert_eq!(digest_path(&entry).unwrap(), digest);
}

#[test]
fn cli_exit_code_and_termination_message() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    model_tree(&src);
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let log = tmp.path().join("termination-log");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
        .args([
            "fetch",
            "--uri",
            &format!("file://{}", src.display()),
            "--digest",
            &wrong,
        ])
        .arg("--dest")
        .arg(tmp.path().join("dest"))
        .arg("--termination-log")
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let message = fs::read_to_string(&log).unwrap();
    assert!(
        message.starts_with("DigestMismatch: ") && message.contains(&wrong),
        "{message}"
    );
    assert_eq!(message.lines().count(), 1);
    assert!(!tmp.path().join("dest").exists());

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
        .args([
            "fetch",
            "--uri",
            "file:///x",
            "--digest",
            "sha256:nothex",
            "--dest",
            "/tmp/unused-mf",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--digest must be sha256:"));

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
        .arg("digest")
        .arg(&src)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        digest_path(&src).unwrap()
    );
}

/// What a listener saw: `Authorization` headers (None when absent), one per request.
type Seen = Arc<Mutex<Vec<Option<String>>>>;

fn auth_of(h: &HeaderMap) -> Option<String> {
    h.get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_string())
}

/// A plain-http origin: `/files/{name}` serves `bytes`, `/redirect/{n}` answers 302 to `to[n]`, and
/// `/stall/{name}` sends headers then nothing; every request's `Authorization` is recorded.
async fn origin(bytes: Vec<u8>, to: Vec<String>, seen: Seen) -> String {
    let files = {
        let seen = seen.clone();
        move |h: HeaderMap| {
            let (seen, bytes) = (seen.clone(), bytes.clone());
            async move {
                seen.lock().unwrap().push(auth_of(&h));
                bytes
            }
        }
    };
    let redirect = {
        let seen = seen.clone();
        move |UrlPath((n, _name)): UrlPath<(usize, String)>, h: HeaderMap| {
            let (seen, to) = (seen.clone(), to.clone());
            async move {
                seen.lock().unwrap().push(auth_of(&h));
                (StatusCode::FOUND, [(header::LOCATION, to[n].clone())]).into_response()
            }
        }
    };
    let stall = move || async move {
        let forever = futures::stream::pending::<Result<Bytes, std::io::Error>>();
        Response::builder()
            .header(header::CONTENT_LENGTH, 1000)
            .body(Body::from_stream(forever))
            .unwrap()
    };
    let endless = move || async move {
        let chunks = futures::stream::repeat_with(|| Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 8192])));
        Response::new(Body::from_stream(chunks))
    };
    let app = Router::new()
        .route("/files/{name}", get(files))
        .route("/redirect/{n}/{name}", get(redirect))
        .route("/stall/{name}", get(stall))
        .route("/endless/{name}", get(endless));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A certificate for 127.0.0.1 (made by the openssl command line) in `dir`: (cert.pem, key.pem).
fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args(["-days", "1", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl on PATH (make setup installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

/// An https origin serving `bytes` for any path (HTTP/1.1 by hand over tokio-rustls), recording each
/// request's `Authorization`.
async fn https_origin(cert: &Path, key: &Path, bytes: Vec<u8>, seen: Seen) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let certs = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, bytes, seen) = (acceptor.clone(), bytes.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let auth = text
                    .lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                    .map(|l| l["authorization:".len()..].trim().to_string());
                seen.lock().unwrap().push(auth);
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    bytes.len()
                );
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.write_all(&bytes).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    format!("https://127.0.0.1:{}", addr.port())
}

#[tokio::test]
async fn the_token_goes_only_to_the_hub_and_redirects_only_to_https() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    let file = tmp.path().join("model.gguf");
    fs::write(&file, &bytes).unwrap();
    let digest = digest_path(&file).unwrap();
    let (cert, key) = certificate(tmp.path());
    let (hub_seen, other_seen, tls_seen): (Seen, Seen, Seen) = Default::default();
    let tls = https_origin(&cert, &key, bytes.clone(), tls_seen.clone()).await;
    let other = origin(bytes.clone(), vec![], other_seen.clone()).await;
    let hub = origin(
        bytes.clone(),
        vec![
            format!("{tls}/blob/model.gguf"),
            format!("{other}/files/model.gguf"),
        ],
        hub_seen.clone(),
    )
    .await;
    let with_token = |uri: String, dest: &str| FetchRequest {
        access: Access {
            hf_endpoint: hub.clone(),
            hf_token: Some(TOKEN.into()),
            ca_file: Some(cert.clone()),
            ..Access::default()
        },
        ..request(&uri, &digest, &tmp.path().join(dest))
    };
    let bearer = Some(format!("Bearer {TOKEN}"));

    // Another origin never gets the token, even for a plain download.
    fetch(&with_token(format!("{other}/files/model.gguf"), "a"))
        .await
        .unwrap();
    assert_eq!(*other_seen.lock().unwrap(), vec![None]);

    // The hub gets it; its redirect to another (https) origin is followed without it.
    fetch(&with_token(format!("{hub}/redirect/0/model.gguf"), "b"))
        .await
        .unwrap();
    assert_eq!(fs::read(tmp.path().join("b/model.gguf")).unwrap(), bytes);
    assert_eq!(*hub_seen.lock().unwrap(), vec![bearer.clone()]);
    assert_eq!(*tls_seen.lock().unwrap(), vec![None]);

    // A redirect to plain http is refused before anything is sent there.
    let err = fetch(&with_token(format!("{hub}/redirect/1/model.gguf"), "c"))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "SourceUnavailable", "{err}");
    assert!(err.to_string().contains("http:// URL refused"), "{err}");
    assert!(!err.to_string().contains(TOKEN));
    assert_eq!(
        other_seen.lock().unwrap().len(),
        1,
        "nothing more reached the http origin"
    );
    assert!(!tmp.path().join("c").exists());
}

#[tokio::test]
async fn downloads_are_bounded_in_bytes_and_in_time() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = vec![5u8; 10_000];
    let file = tmp.path().join("model.gguf");
    fs::write(&file, &bytes).unwrap();
    let digest = digest_path(&file).unwrap();
    let base = origin(bytes, vec![], Seen::default()).await;
    let limited = |path: &str, dest: &str, limits: Limits| FetchRequest {
        limits,
        ..request(
            &format!("{base}/{path}/model.gguf"),
            &digest,
            &tmp.path().join(dest),
        )
    };
    let bytes_only = |max| Limits {
        max_bytes: Some(max),
        timeout: None,
    };
    fetch(&limited("files", "fits", bytes_only(10_000)))
        .await
        .unwrap();
    // Known length over the limit: refused before a byte is written.
    let err = fetch(&limited("files", "big", bytes_only(9_999)))
        .await
        .unwrap_err();
    assert_eq!((err.reason(), err.exit_code()), ("TooLarge", 7), "{err}");
    // No length, a body without end: cut off at the limit.
    let err = fetch(&limited("endless", "endless", bytes_only(1 << 20)))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "TooLarge", "{err}");
    // A file:// tree over the limit.
    let err = fetch(&FetchRequest {
        limits: bytes_only(100),
        ..request(
            &format!("file://{}", file.display()),
            &digest,
            &tmp.path().join("local"),
        )
    })
    .await
    .unwrap_err();
    assert_eq!(err.reason(), "TooLarge", "{err}");
    // A body that never comes: the time limit ends it.
    let t0 = std::time::Instant::now();
    let err = fetch(&limited(
        "stall",
        "stall",
        Limits {
            max_bytes: None,
            timeout: Some(std::time::Duration::from_millis(500)),
        },
    ))
    .await
    .unwrap_err();
    assert_eq!((err.reason(), err.exit_code()), ("TimedOut", 8), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        entries(tmp.path()),
        ["fits", "model.gguf"],
        "no staging leftovers, DEST untouched"
    );
}
