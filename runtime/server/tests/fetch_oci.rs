//! `package` and `fetch` against a real OCI registry (Debian's `docker-registry`, tests/oci): ModelPack
//! artifacts and model images pushed reproducibly and pulled back to the same canonical digest; blobs
//! resumed from a partial download with a `Range` request; cosign-style signatures required, missing,
//! made with another key, or moved to another digest; and the refusals a user meets — a wrong
//! manifest digest, a content digest that does not match, a tag without a digest, wrong credentials.
//! Real `cosign` signatures are checked end to end in e2e/tests/delivery.rs.

mod oci;

use base64::Engine as _;
use modelfleet_runtime::digest::digest_path;
use modelfleet_runtime::fetch::source::oci::auth::DockerConfig;
use modelfleet_runtime::fetch::source::oci::signature::{PublicKey, signature_tag};
use modelfleet_runtime::fetch::{Access, FetchError, FetchRequest, Source, fetch};
use modelfleet_runtime::package::artifact::Format;
use modelfleet_runtime::package::{PackageArgs, Packaged, package};
use oci::Registry;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::EncodePublicKey as _;
use std::path::{Path, PathBuf};

/// A small model directory: configs, a tokenizer, "weights" of `weights` bytes, a nested doc.
fn model_dir(root: &Path, weights: usize) -> PathBuf {
    let dir = root.join("tiny-model");
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        br#"{"architectures":["LlamaForCausalLM"]}"#,
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), br#"{"model":{}}"#).unwrap();
    let bytes: Vec<u8> = (0..weights).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    std::fs::write(dir.join("docs/README.md"), b"# tiny\n").unwrap();
    dir
}

async fn push(registry: &Registry, dir: &Path, repo: &str, format: Format) -> Packaged {
    let args = PackageArgs {
        path: dir.to_path_buf(),
        to: format!("oci://{}/{repo}:v1", registry.host),
        format,
        plain_http: true,
        auth_file: None,
        ca_file: None,
    };
    package(&args).await.unwrap()
}

fn request(uri: &str, digest: &str, dest: &Path) -> FetchRequest {
    FetchRequest {
        access: Access {
            registry_plain_http: true,
            ..Access::default()
        },
        ..FetchRequest::new(Source::parse(uri).unwrap(), digest, dest)
    }
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        out.push((
            e.strip_prefix(dir).unwrap().display().to_string(),
            std::fs::read(&e).unwrap(),
        ));
    }
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn both_shapes_round_trip_reproducibly_to_the_canonical_digest() {
    let registry = Registry::start(None);
    let t = tempfile::tempdir().unwrap();
    let dir = model_dir(t.path(), 300_000);
    let want = digest_path(&dir).unwrap();
    for (format, repo) in [
        (Format::Modelpack, "models/tiny"),
        (Format::Image, "models/tiny-image"),
    ] {
        let first = push(&registry, &dir, repo, format).await;
        let second = push(&registry, &dir, repo, format).await;
        assert_eq!(
            first, second,
            "{format:?}: two packagings of the same files differ"
        );
        assert_eq!(
            first.digest, want,
            "{format:?}: package prints the canonical digest"
        );
        assert!(
            first
                .uri
                .starts_with(&format!("oci://{}/{repo}:v1@sha256:", registry.host)),
            "{}",
            first.uri
        );
        let dest = t.path().join(format!("dest-{repo}").replace('/', "-"));
        let how = fetch(&request(&first.uri, &first.digest, &dest)).await.unwrap();
        assert_eq!(how, modelfleet_runtime::fetch::Fetched::FromSource);
        assert_eq!(digest_path(&dest).unwrap(), want, "{format:?}");
        assert_eq!(
            files(&dest),
            files(&dir),
            "{format:?}: the same files, nothing else"
        );
    }
    // The two shapes are different artifacts of the same model.
    let mp = push(&registry, &dir, "models/tiny", Format::Modelpack).await;
    let im = push(&registry, &dir, "models/tiny-image", Format::Image).await;
    assert_ne!(
        mp.uri.rsplit_once('@').unwrap().1,
        im.uri.rsplit_once('@').unwrap().1
    );
}

#[tokio::test]
async fn a_partial_blob_in_the_node_cache_is_resumed_with_a_range_request() {
    let registry = Registry::start(None);
    let t = tempfile::tempdir().unwrap();
    let dir = model_dir(t.path(), 2_000_000);
    let packaged = push(&registry, &dir, "models/resume", Format::Modelpack).await;
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let blob = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&weights))
    );
    // An earlier attempt (another process) got half of the weights into the node cache.
    let cache = t.path().join("cache");
    std::fs::create_dir_all(cache.join(".blobs")).unwrap();
    std::fs::write(
        cache
            .join(".blobs")
            .join(format!("{}.partial", blob.replace(':', "-"))),
        &weights[..weights.len() / 2],
    )
    .unwrap();
    let req = FetchRequest {
        cache: Some(cache.clone()),
        ..request(&packaged.uri, &packaged.digest, &t.path().join("dest"))
    };
    fetch(&req).await.unwrap();
    assert_eq!(digest_path(&t.path().join("dest")).unwrap(), packaged.digest);
    let reads = registry.blob_reads(&blob);
    assert_eq!(reads.len(), 1, "one request for the rest of the blob: {reads:?}");
    assert!(
        reads[0].contains("\" 206 "),
        "a Range request answered 206: {}",
        reads[0]
    );
    // A second pod on the node finds it in the cache: the registry is not asked again.
    let again = FetchRequest {
        cache: Some(cache),
        ..request(&packaged.uri, &packaged.digest, &t.path().join("dest2"))
    };
    assert_eq!(
        fetch(&again).await.unwrap(),
        modelfleet_runtime::fetch::Fetched::FromCache
    );
    assert_eq!(registry.blob_reads(&blob).len(), 1);
}

/// A cosign-style signature of `digest` (simple signing payload, ECDSA P-256 DER, base64) pushed under
/// `tag` in `repo`.
async fn push_signature(registry: &Registry, repo: &str, tag: &str, digest: &str, key: &SigningKey) {
    let payload = serde_json::to_vec(&serde_json::json!({"critical": {
        "identity": {"docker-reference": format!("{}/{repo}", registry.host)},
        "image": {"docker-manifest-digest": digest}, "type": "cosign container image signature"},
        "optional": null}))
    .unwrap();
    let sig: Signature = key.sign(&payload);
    let b64 = base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes());
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    });
    let r = oci_client::Reference::with_tag(registry.host.clone(), repo.into(), tag.into());
    client
        .store_auth_if_needed(&registry.host, &oci_client::secrets::RegistryAuth::Anonymous)
        .await;
    let payload_digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&payload))
    );
    client
        .push_blob(&r, payload.clone(), &payload_digest)
        .await
        .unwrap();
    let config = b"{}".to_vec();
    let config_digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&config))
    );
    client
        .push_blob(&r, config.clone(), &config_digest)
        .await
        .unwrap();
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": payload_digest,
            "size": payload.len(), "annotations": {"dev.cosignproject.cosign/signature": b64}}]});
    let ct = reqwest::header::HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json");
    client
        .push_manifest_raw(&r, serde_json::to_vec(&manifest).unwrap(), ct)
        .await
        .unwrap();
}

fn public_key(key: &SigningKey) -> PublicKey {
    let pem = key
        .verifying_key()
        .to_public_key_pem(p256::pkcs8::LineEnding::LF)
        .unwrap();
    PublicKey::parse(&pem).unwrap()
}

#[tokio::test]
async fn signatures_are_required_verified_and_bound_to_the_digest() {
    let registry = Registry::start(None);
    let t = tempfile::tempdir().unwrap();
    let dir = model_dir(t.path(), 10_000);
    let signed = push(&registry, &dir, "models/signed", Format::Modelpack).await;
    let other = push(&registry, &dir, "models/signed", Format::Image).await;
    let manifest = |p: &Packaged| p.uri.rsplit_once('@').unwrap().1.to_string();
    let key = SigningKey::from_slice(&[7u8; 32]).unwrap();
    let wrong = SigningKey::from_slice(&[9u8; 32]).unwrap();
    push_signature(
        &registry,
        "models/signed",
        &signature_tag(&manifest(&signed)),
        &manifest(&signed),
        &key,
    )
    .await;
    // The image's signature tag holds a valid signature of the *ModelPack* manifest (moved).
    push_signature(
        &registry,
        "models/signed",
        &signature_tag(&manifest(&other)),
        &manifest(&signed),
        &key,
    )
    .await;
    let run = |p: &Packaged, k: &SigningKey, dest: &str| {
        let req = FetchRequest {
            signature_key: Some(public_key(k)),
            ..request(&p.uri, &p.digest, &t.path().join(dest))
        };
        async move { fetch(&req).await }
    };
    run(&signed, &key, "ok").await.unwrap();
    let reason = |r: Result<_, FetchError>| r.unwrap_err().reason();
    assert_eq!(
        reason(run(&signed, &wrong, "wrong-key").await),
        "SignatureInvalid"
    );
    assert_eq!(
        reason(run(&other, &key, "moved").await),
        "SignatureDigestMismatch"
    );
    let unsigned = push(
        &registry,
        &model_dir(&t.path().join("u"), 5),
        "models/unsigned",
        Format::Modelpack,
    )
    .await;
    let e = run(&unsigned, &key, "unsigned").await.unwrap_err();
    assert_eq!(e.reason(), "SignatureNotFound", "{e}");
    assert!(
        !t.path().join("unsigned").exists() && !t.path().join("moved").exists(),
        "nothing written"
    );
    // Nothing of a refused artifact was pulled: its blobs were never read.
    let weights = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            std::fs::read(t.path().join("u/tiny-model/model.safetensors")).unwrap()
        ))
    );
    assert!(registry.blob_reads(&weights).is_empty());
}

#[tokio::test]
async fn refusals_name_the_problem() {
    let registry = Registry::start(None);
    let t = tempfile::tempdir().unwrap();
    let dir = model_dir(t.path(), 1000);
    let p = push(&registry, &dir, "models/r", Format::Modelpack).await;
    let err = |uri: &str, digest: &str| {
        let req = request(uri, digest, &t.path().join("dest"));
        async move { fetch(&req).await.unwrap_err() }
    };
    let missing = format!("oci://{}/models/r@sha256:{}", registry.host, "1".repeat(64));
    let e = err(&missing, &p.digest).await;
    assert_eq!(e.reason(), "SourceUnavailable", "{e}");
    assert!(e.to_string().contains("not found"), "{e}");
    let e = err(&p.uri, &format!("sha256:{}", "2".repeat(64))).await;
    assert_eq!(e.reason(), "DigestMismatch", "{e}");
    let e = Source::parse(&format!("oci://{}/models/r:v1", registry.host)).unwrap_err();
    assert!(e.to_string().contains("must pin the manifest digest"), "{e}");
    let e = err(&p.uri.replace(&registry.host, "127.0.0.1:9"), &p.digest).await;
    assert_eq!(e.reason(), "SourceUnavailable", "{e}");
    assert!(!t.path().join("dest").exists());
}

#[tokio::test]
async fn credentials_go_to_their_registry_and_wrong_ones_are_named() {
    // user `modelfleet`, password `s3cret-pw` (bcrypt, made with Python's crypt module).
    let line = "modelfleet:$2b$12$LLsQA7QA.TOkiiVoumR0jeKzNYr5PaxEFYiYHDTmA8bFowjYeKcvi";
    let registry = Registry::start(Some(line));
    let t = tempfile::tempdir().unwrap();
    let config = |user: &str, pw: &str| {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
        let path = t.path().join(format!("auth-{pw}.json"));
        std::fs::write(
            &path,
            format!(r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#, registry.host),
        )
        .unwrap();
        path
    };
    let good = config("modelfleet", "s3cret-pw");
    let dir = model_dir(t.path(), 1000);
    let args = PackageArgs {
        path: dir.clone(),
        to: format!("oci://{}/private/m:v1", registry.host),
        format: Format::Modelpack,
        plain_http: true,
        auth_file: Some(good.clone()),
        ca_file: None,
    };
    let p = package(&args).await.unwrap();
    let with = |auth: Option<&Path>, dest: &str| {
        let req = FetchRequest {
            access: Access {
                registry_plain_http: true,
                registry_auth: auth.map(|a| DockerConfig::read(a).unwrap()),
                ..Access::default()
            },
            ..FetchRequest::new(
                Source::parse(&p.uri).unwrap(),
                p.digest.clone(),
                t.path().join(dest),
            )
        };
        async move { fetch(&req).await }
    };
    with(Some(&good), "ok").await.unwrap();
    for (auth, dest) in [(Some(config("modelfleet", "wrong-pw")), "wrong"), (None, "none")] {
        let e = with(auth.as_deref(), dest).await.unwrap_err();
        assert_eq!(e.reason(), "Unauthorized", "{dest}: {e}");
        assert!(
            !e.to_string().contains("wrong-pw"),
            "no secret in the message: {e}"
        );
    }
}
