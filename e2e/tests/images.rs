//! The release images against the local cluster's OCI registry (Debian's docker-registry on loopback),
//! end to end: `make images push REGISTRY=$MF_REGISTRY` pushes the images `make images` built (the three
//! programs' and the limits store's)
//! (they must exist: `make test` builds and checks them first) and prints chart values that pin them by
//! digest; each is pulled back by that digest with a real client (skopeo) and is the image that was
//! built (same config); `helm template` of the whole chart with those values renders every image by
//! digest from the registry and passes `kubectl apply --dry-run=server` on the real API server; and
//! without `image.registry` the install fails and says what to set. Run by `make e2e`.

mod common;
use common::*;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `digest:` that follows `repository: modelfleet/<program>` in the printed values.
fn values_digest(values: &str, program: &str) -> String {
    let mut lines = values
        .lines()
        .skip_while(|l| !l.contains(&format!("repository: modelfleet/{program}")));
    lines
        .find_map(|l| l.trim().strip_prefix("digest: ").map(str::to_string))
        .unwrap_or_else(|| panic!("no digest for {program} in:\n{values}"))
}

#[tokio::test]
#[ignore = "needs the local cluster and `make images`: make test"]
async fn images_push_by_digest_pull_back_and_the_chart_installs_with_the_printed_values() {
    let root = repo_root();
    let registry = registry();
    assert!(
        root.join("dist/VERSION").exists(),
        "no images built: run `make images` first (make test does)"
    );
    let printed = run(Command::new("bash")
        .arg(root.join("images/build.sh"))
        .arg("push")
        .env("REGISTRY", &registry));
    eprintln!("make images push REGISTRY={registry} printed:\n{printed}");
    let version = std::fs::read_to_string(root.join("dist/VERSION"))
        .unwrap()
        .trim()
        .to_string();
    let store = std::env::var("MODELFLEET_IMAGE_STORE")
        .unwrap_or_else(|_| format!("{}/.cache/modelfleet/containers", std::env::var("HOME").unwrap()));
    let local = format!("containers-storage:[vfs@{store}/storage+{store}/run]");
    let pulled = tempfile::tempdir().unwrap();
    for p in ["operator", "gateway", "runtime", "store"] {
        let digest = values_digest(&printed, p);
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{p}: {digest}"
        );
        let by_digest = format!("docker://{registry}/modelfleet/{p}@{digest}");
        // The registry serves that manifest under that digest.
        let inspected: serde_json::Value = serde_json::from_str(&run(Command::new("skopeo").args([
            "inspect",
            "--tls-verify=false",
            &by_digest,
        ])))
        .unwrap();
        assert_eq!(inspected["Digest"], digest.as_str(), "{p}");
        // Pulled back by digest, it is the image that was built: the same config.
        let dest = format!("oci:{}:{p}", pulled.path().display());
        run(Command::new("skopeo").args(["copy", "--quiet", "--src-tls-verify=false", &by_digest, &dest]));
        let config = |src: &str| -> serde_json::Value {
            let v: serde_json::Value =
                serde_json::from_str(&run(Command::new("skopeo").args(["inspect", "--config", src])))
                    .unwrap();
            v["config"].clone()
        };
        let built = config(&format!("{local}localhost/modelfleet/{p}:{version}"));
        assert_eq!(
            config(&dest),
            built,
            "{p}: pulled back by digest, a different image"
        );
        assert_eq!(built["User"], "65532:65532", "{p}");
    }

    // The whole chart with the printed values: every image from the registry by digest, and the API
    // server accepts every object.
    let ns = TestNamespace::new("chart");
    let values = root.join("dist/helm-values.yaml");
    let rendered = run(Command::new("helm")
        .args(["template", "modelfleet"])
        .arg(root.join("charts/modelfleet"))
        .args(["--namespace", &ns.name, "--kube-version", "1.35.4", "-f"])
        .arg(&values));
    let images: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .chain(
            rendered
                .lines()
                .filter_map(|l| l.trim().strip_prefix("- --runtime-image=")),
        )
        .collect();
    assert!(images.len() >= 4, "{images:?}");
    for image in &images {
        let image = image.trim_matches('"');
        assert!(
            image.starts_with(&format!("{registry}/modelfleet/")) && image.contains("@sha256:"),
            "{image} is not pinned in {registry}"
        );
    }
    let mut apply = Command::new("kubectl");
    apply.args(["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"]);
    let out = {
        use std::io::Write;
        let mut child = apply
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(rendered.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    assert!(
        out.status.success(),
        "kubectl apply --dry-run=server refused the chart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied = String::from_utf8_lossy(&out.stdout);
    assert!(
        applied.contains("deployment.apps/modelfleet created (server dry run)"),
        "{applied}"
    );

    // Without image.registry, the install fails before touching the cluster, saying what to do.
    let out = Command::new("helm")
        .args(["install", "no-registry"])
        .arg(root.join("charts/modelfleet"))
        .args(["--namespace", &ns.name])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "installed without image.registry");
    assert!(
        said.contains("image.registry is required") && said.contains("make images push REGISTRY="),
        "{said}"
    );
}
