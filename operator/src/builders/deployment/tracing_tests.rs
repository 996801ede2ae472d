//! The runtime pods' trace export: what the operator's `--otlp-traces-endpoint` gives them.

use super::*;
use crate::builders::fixtures::minimal;
use crate::config::RuntimeTracing;

fn runtime_env(cfg: &OperatorConfig) -> Vec<EnvVar> {
    let d = desired_deployment(&minimal(), cfg, 1).unwrap();
    let pod = d.spec.unwrap().template.spec.unwrap();
    pod.containers[0].env.clone().unwrap_or_default()
}

fn value<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a str> {
    env.iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

#[test]
fn runtime_pods_export_where_the_operator_does_and_name_themselves() {
    let cfg = OperatorConfig {
        tracing: Some(RuntimeTracing {
            endpoint: "http://otel.observability:4318".into(),
            sample_ratio: Some(0.25),
        }),
        ..Default::default()
    };
    let env = runtime_env(&cfg);
    assert_eq!(
        value(&env, "MODELFLEET_OTLP_TRACES_ENDPOINT"),
        Some("http://otel.observability:4318")
    );
    assert_eq!(value(&env, "MODELFLEET_TRACE_SAMPLE_RATIO"), Some("0.25"));
    let attrs = value(&env, "OTEL_RESOURCE_ATTRIBUTES").unwrap();
    assert!(attrs.contains("k8s.pod.name=$(POD_NAME)"), "{attrs}");
    // `$(POD_NAME)` expands only from variables defined before it.
    let pos = |n: &str| env.iter().position(|e| e.name == n).unwrap();
    assert!(pos("POD_NAME") < pos("OTEL_RESOURCE_ATTRIBUTES"));
}

#[test]
fn without_an_endpoint_runtime_pods_do_not_trace() {
    let env = runtime_env(&OperatorConfig::default());
    assert!(
        env.iter()
            .all(|e| !e.name.contains("OTLP") && !e.name.starts_with("OTEL_")),
        "{env:?}"
    );
}
