//! What the generated CRDs promise the API server and kubectl: subresources, names, printer columns,
//! and the validation rules. (The e2e suite proves the real API server enforces them.)

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use modelfleet_crds::{LoraAdapter, ModelDeployment};

fn json(crd: &CustomResourceDefinition) -> String {
    serde_json::to_string(crd).unwrap()
}

fn check_contains(crd: &CustomResourceDefinition, needles: &[&str]) {
    let text = json(crd);
    for needle in needles {
        assert!(text.contains(needle), "{} lacks {needle}", crd.spec.names.kind);
    }
}

#[test]
fn model_deployment_names_and_subresources() {
    let crd = ModelDeployment::crd();
    assert_eq!(crd.spec.group, "modelfleet.io");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["md".to_string()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["modelfleet".to_string()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    let sub = version.subresources.as_ref().expect("subresources");
    assert!(sub.status.is_some());
    let scale = sub.scale.as_ref().expect("scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
    let columns: Vec<&str> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Model",
            "Desired",
            "Ready",
            "Queue",
            "KV %",
            "TTFT p95",
            "ITL p95",
            "Stable",
            "Canary",
            "Weight",
            "Step",
            "Cost/Mtok",
            "Starting",
            "Age"
        ]
    );
}

#[test]
fn model_deployment_validation_rules() {
    check_contains(
        &ModelDeployment::crd(),
        &[
            r#""pattern":"^sha256:[0-9a-f]{64}$""#,
            r#""rule":"self.minReplicas <= self.maxReplicas""#,
            r#""rule":"!has(self.spec.autoscaling) || self.spec.autoscaling.mode != 'Builtin' || !has(self.spec.replicas)""#,
            r#""rule":"self.source != 'Prometheus' || has(self.prometheus)""#,
            r#""rule":"has(self.ttftP95) || has(self.itlP95)""#,
            r#""rule":"has(self.minReplicas) || has(self.maxReplicas)""#,
            r#""rule":"!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas""#,
            r#""x-kubernetes-list-type":"map""#,
            r#""x-kubernetes-list-map-keys":["type"]"#,
            r#""enum":["Builtin","External","Disabled"]"#,
            r#""enum":["Tenant","Deployment"]"#,
        ],
    );
}

#[test]
fn lora_adapter_names_and_rules() {
    let crd = LoraAdapter::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["lora".to_string()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["modelfleet".to_string()]));
    check_contains(
        &crd,
        &[
            r#""rule":"self == oldSelf""#,
            r#""pattern":"^sha256:[0-9a-f]{64}$""#,
            r#""x-kubernetes-list-type":"set""#,
        ],
    );
}

#[test]
fn spec_round_trips_through_json() {
    let text = r#"{"apiVersion":"modelfleet.io/v1alpha1","kind":"ModelDeployment",
        "metadata":{"name":"smollm2","namespace":"default"},
        "spec":{"model":{"uri":"file:///models/smollm2.gguf",
                         "digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"},
                "autoscaling":{"minReplicas":1,"maxReplicas":3}}}"#;
    let md: ModelDeployment = serde_json::from_str(text).unwrap();
    let autoscaling = md.spec.autoscaling.as_ref().unwrap();
    assert_eq!(
        autoscaling.mode,
        modelfleet_crds::model_deployment::AutoscalingMode::Builtin
    );
    assert_eq!(autoscaling.scale_down_stabilization_seconds, 300);
    let back: ModelDeployment = serde_json::from_value(serde_json::to_value(&md).unwrap()).unwrap();
    assert_eq!(back.spec, md.spec);
}
