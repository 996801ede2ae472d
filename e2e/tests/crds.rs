//! The CRDs install on the real API server, which then enforces their schema: patterns, bounds, CEL
//! rules, immutability, and the `scale` subresource. Run by `make e2e` against `e2e/cluster up`.

mod common;
use common::*;

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn model_deployment(name: &str, extra_spec: &str, digest: &str) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  \
         model:\n    uri: file:///models/tiny\n    digest: \"{digest}\"\n{extra_spec}"
    )
}

fn lora(name: &str, base: &str) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: LoraAdapter\nmetadata:\n  name: {name}\nspec:\n  \
         modelDeploymentRef:\n    name: {base}\n  uri: file:///adapters/{name}\n  digest: \"{DIGEST}\"\n"
    )
}

fn install_crds() {
    let dir = repo_root().join("crds");
    kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            dir.to_str().unwrap(),
        ],
        None,
    );
    kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/modeldeployments.modelfleet.io",
            "crd/loraadapters.modelfleet.io",
        ],
        None,
    );
}

/// Applies `yaml` in `ns` and expects the API server to refuse it with a message containing `expected`.
fn check_rejected(ns: &str, case: &str, yaml: &str, expected: &str) {
    let out = kubectl(&["apply", "-n", ns, "-f", "-"], Some(yaml));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{case}: the API server accepted an invalid object:\n{yaml}"
    );
    assert!(
        stderr.contains(expected),
        "{case}: expected {expected:?} in the error, got: {stderr}"
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn crds_install_and_the_api_server_enforces_their_schema() {
    install_crds();
    let ns = TestNamespace::new("crds");
    let ns = ns.name.as_str();

    // A valid object is accepted and found through its short name and category.
    let autoscaled = "  autoscaling:\n    minReplicas: 1\n    maxReplicas: 3\n";
    kubectl_ok(
        &["apply", "-n", ns, "-f", "-"],
        Some(&model_deployment("tiny", autoscaled, DIGEST)),
    );
    assert!(kubectl_ok(&["get", "md", "-n", ns], None).contains("tiny"));
    let by_category = kubectl_ok(&["get", "modelfleet", "-n", ns, "-o", "name"], None);
    assert!(
        by_category.contains("modeldeployment.modelfleet.io/tiny"),
        "{by_category}"
    );
    // Defaults from the schema are applied by the API server.
    let mode = kubectl_ok(
        &[
            "get",
            "md",
            "tiny",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.autoscaling.mode}",
        ],
        None,
    );
    assert_eq!(mode, "Builtin");
    // spec.cost: a decimal price; currency and window default.
    kubectl_ok(
        &["apply", "-n", ns, "-f", "-"],
        Some(&model_deployment(
            "priced",
            "  cost:\n    pricePerReplicaHour: \"2.50\"\n",
            DIGEST,
        )),
    );
    let cost = kubectl_ok(
        &[
            "get",
            "md",
            "priced",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.cost.currency} {.spec.cost.windowSeconds}",
        ],
        None,
    );
    assert_eq!(cost, "USD 600");

    let cases: &[(&str, String, &str)] = &[
        (
            "digest pattern",
            model_deployment("bad-digest", "", "sha256:XYZ"),
            "should match '^sha256:[0-9a-f]{64}$'",
        ),
        (
            "uri scheme",
            model_deployment("bad-uri", "", DIGEST).replace("file:///models/tiny", "ftp://x/y"),
            "should match '^(file|https?|hf|oci|s3|pvc)://.+$'",
        ),
        (
            "minReplicas > maxReplicas (CEL)",
            model_deployment(
                "min-max",
                "  autoscaling:\n    minReplicas: 5\n    maxReplicas: 2\n",
                DIGEST,
            ),
            "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
        ),
        (
            "minReplicas lower bound",
            model_deployment("min-negative", "  autoscaling:\n    minReplicas: -1\n", DIGEST),
            "should be greater than or equal to 0",
        ),
        (
            "replicas with Builtin autoscaling (CEL)",
            model_deployment(
                "both",
                "  replicas: 2\n  autoscaling:\n    mode: Builtin\n",
                DIGEST,
            ),
            "spec.replicas must not be set while spec.autoscaling.mode is Builtin",
        ),
        (
            "Prometheus source without a URL (CEL)",
            model_deployment(
                "prom",
                "  autoscaling:\n    metrics:\n      source: Prometheus\n",
                DIGEST,
            ),
            "metrics.prometheus.url is required when metrics.source is Prometheus",
        ),
        (
            "KV block size (CEL)",
            model_deployment(
                "blocks",
                "  runtime:\n    kvCache:\n      blockSize: 12\n",
                DIGEST,
            ),
            "blockSize must be one of 8, 16, 32, 64, 128",
        ),
        (
            "a fallback target with both a deployment and a provider (CEL)",
            model_deployment(
                "two-places",
                "  fallback:\n    targets:\n    - modelDeployment: small\n      provider:\n        name: ext\n        \
                 baseUrl: https://api.example.com/v1\n        model: m\n",
                DIGEST,
            ),
            "a fallback target names exactly one of modelDeployment and provider",
        ),
        (
            "a first-token deadline out of range",
            model_deployment(
                "deadline",
                "  fallback:\n    firstTokenDeadlineMilliseconds: 0\n    targets:\n    - modelDeployment: small\n",
                DIGEST,
            ),
            "should be greater than or equal to 1",
        ),
        (
            "unknown autoscaling mode",
            model_deployment("mode", "  autoscaling:\n    mode: Sometimes\n", DIGEST),
            "Unsupported value: \"Sometimes\"",
        ),
        (
            "cost price as a decimal string",
            model_deployment("price", "  cost:\n    pricePerReplicaHour: \"2,50\"\n", DIGEST),
            "spec.cost.pricePerReplicaHour",
        ),
        (
            "cost currency code",
            model_deployment(
                "currency",
                "  cost:\n    pricePerReplicaHour: \"2.50\"\n    currency: dollars\n",
                DIGEST,
            ),
            "spec.cost.currency",
        ),
        (
            "cost without any price",
            model_deployment("noprice", "  cost:\n    currency: EUR\n", DIGEST),
            "spec.cost needs at least one price",
        ),
        (
            "token price with 7 decimals",
            model_deployment(
                "tokprice",
                "  cost:\n    outputPerMillionTokens: \"0.1234567\"\n",
                DIGEST,
            ),
            "spec.cost.outputPerMillionTokens",
        ),
        (
            "cost window lower bound",
            model_deployment(
                "window",
                "  cost:\n    pricePerReplicaHour: \"2.50\"\n    windowSeconds: 5\n",
                DIGEST,
            ),
            "should be greater than or equal to 60",
        ),
        (
            "lora digest",
            lora("bad", "tiny").replace(DIGEST, "md5:abc"),
            "should match '^sha256:[0-9a-f]{64}$'",
        ),
    ];
    for (case, yaml, expected) in cases {
        check_rejected(ns, case, yaml, expected);
    }

    // LoraAdapter.spec.modelDeploymentRef is immutable; other fields may change.
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&lora("style", "tiny")));
    check_rejected(
        ns,
        "immutable ref",
        &lora("style", "other"),
        "modelDeploymentRef is immutable",
    );
    kubectl_ok(
        &["apply", "-n", ns, "-f", "-"],
        Some(&lora("style", "tiny").replace("/style", "/style-v2")),
    );

    // The scale subresource drives spec.replicas in External mode (what HPA and KEDA use) ...
    let external = "  replicas: 1\n  autoscaling:\n    mode: External\n";
    kubectl_ok(
        &["apply", "-n", ns, "-f", "-"],
        Some(&model_deployment("ext", external, DIGEST)),
    );
    kubectl_ok(&["scale", "-n", ns, "md/ext", "--replicas=3"], None);
    let replicas = kubectl_ok(
        &["get", "md", "ext", "-n", ns, "-o", "jsonpath={.spec.replicas}"],
        None,
    );
    assert_eq!(replicas, "3");
    // ... and is refused in Builtin mode, where the autoscaler owns the count.
    let out = kubectl(&["scale", "-n", ns, "md/tiny", "--replicas=3"], None);
    assert!(
        !out.status.success(),
        "kubectl scale of a Builtin-autoscaled ModelDeployment was accepted"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.replicas must not be set"));

    // Printer columns are served.
    let table = kubectl_ok(&["get", "md", "-n", ns], None);
    let header = table.lines().next().unwrap();
    for column in [
        "NAME",
        "MODEL",
        "DESIRED",
        "READY",
        "QUEUE",
        "KV %",
        "COST/MTOK",
        "STARTING",
        "AGE",
    ] {
        assert!(header.contains(column), "missing column {column} in {header}");
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_api_server_enforces_the_rollout_rules() {
    install_crds();
    let ns = TestNamespace::new("crdrollout");
    let ns = ns.name.as_str();
    let rollout = |body: &str| format!("  rollout:\n    {body}\n");
    let valid = rollout(
        "strategy: Canary\n    steps: [{weight: 10, pause: 1m}, {weight: 50, gate: Manual}, {weight: 100, pause: 2m}]\n    \
         mirror: {percent: 20, pause: 1m}\n    analysis: {windowSeconds: 30, maxTtftP95Ratio: \"1.25\"}",
    );
    kubectl_ok(
        &["apply", "-n", ns, "-f", "-"],
        Some(&model_deployment("canary", &valid, DIGEST)),
    );
    // The analysis defaults are the API server's, so `kubectl get -o yaml` shows them.
    let min = kubectl_ok(
        &[
            "get",
            "md",
            "canary",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.rollout.analysis.minRequests}",
        ],
        None,
    );
    assert_eq!(min, "50");
    for (case, body, expected) in [
        (
            "equal weights",
            "strategy: Canary\n    steps: [{weight: 50, pause: 1m}, {weight: 50, pause: 1m}]",
            "weights must increase",
        ),
        (
            "decreasing weights",
            "strategy: Canary\n    steps: [{weight: 50, pause: 1m}, {weight: 10, pause: 1m}]",
            "weights must increase",
        ),
        (
            "a step without pause or gate",
            "strategy: Canary\n    steps: [{weight: 50}]",
            "exactly one of pause",
        ),
        (
            "a step with both",
            "strategy: Canary\n    steps: [{weight: 50, pause: 1m, gate: Manual}]",
            "exactly one of pause",
        ),
        ("Canary without steps", "strategy: Canary", "at least one step"),
        (
            "steps without Canary",
            "steps: [{weight: 10, pause: 1m}]",
            "go with strategy Canary only",
        ),
        (
            "a weight over 100",
            "strategy: Canary\n    steps: [{weight: 101, pause: 1m}]",
            "less than or equal to 100",
        ),
        (
            "a ratio that is not a decimal",
            "strategy: Canary\n    steps: [{weight: 10, pause: 1m}]\n    analysis: {maxItlP95Ratio: \"1.5x\"}",
            "maxItlP95Ratio",
        ),
    ] {
        check_rejected(
            ns,
            case,
            &model_deployment("bad", &rollout(body), DIGEST),
            expected,
        );
    }
}
