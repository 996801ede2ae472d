//! The strategic merge as data: (base, patch) → merged template, or the field an error names.

use super::*;
use serde_json::json;

fn merged(base: Value, patch: Value) -> Result<Value, MergeError> {
    let mut b = base;
    merge_template(&mut b, &patch).map(|()| b)
}

fn base() -> Value {
    json!({
        "metadata": {"labels": {"app": "x"}, "annotations": {"a": "1"}},
        "spec": {
            "containers": [{
                "name": "runtime",
                "args": ["serve", "--port", "8000"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "TMPDIR", "value": "/tmp"}],
                "volumeMounts": [{"name": "model", "mountPath": "/m", "readOnly": true}],
                "resources": {"limits": {"memory": "1Gi"}},
            }],
            "volumes": [{"name": "model", "emptyDir": {}}],
            "tolerations": [{"key": "a", "operator": "Exists"}],
            "imagePullSecrets": [{"name": "regcred"}],
        },
    })
}

#[test]
fn maps_merge_key_by_key_and_null_removes() {
    let out = merged(
        base(),
        json!({"metadata": {"labels": {"team": "ml"}, "annotations": {"a": null, "b": "2"}}}),
    )
    .unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"app": "x", "team": "ml"}));
    assert_eq!(out["metadata"]["annotations"], json!({"b": "2"}));
}

#[test]
fn containers_merge_by_name_and_their_lists_by_their_keys() {
    let out = merged(
        base(),
        json!({"spec": {"containers": [
            {"name": "runtime",
             "env": [{"name": "TMPDIR", "value": "/scratch"}, {"name": "EXTRA", "value": "1"}],
             "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/custom", "readOnly": true}],
             "resources": {"requests": {"cpu": "2"}}},
            {"name": "sidecar", "image": "envoy"},
        ]}}),
    )
    .unwrap();
    let containers = out["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2, "a new name is appended");
    let runtime = &containers[0];
    assert_eq!(runtime["args"], json!(["serve", "--port", "8000"]), "untouched");
    assert_eq!(
        runtime["env"],
        json!([{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
               {"name": "TMPDIR", "value": "/scratch"},
               {"name": "EXTRA", "value": "1"}]),
        "merged in place by name, the new one last"
    );
    assert_eq!(runtime["volumeMounts"].as_array().unwrap().len(), 2);
    assert_eq!(
        runtime["resources"],
        json!({"limits": {"memory": "1Gi"}, "requests": {"cpu": "2"}})
    );
    assert_eq!(containers[1], json!({"name": "sidecar", "image": "envoy"}));
}

#[test]
fn lists_without_a_merge_key_and_scalars_replace() {
    let out = merged(
        base(),
        json!({"spec": {
            "tolerations": [{"key": "b", "operator": "Exists"}],
            "containers": [{"name": "runtime", "args": ["other"]}],
            "priorityClassName": "high",
        }}),
    )
    .unwrap();
    assert_eq!(
        out["spec"]["tolerations"],
        json!([{"key": "b", "operator": "Exists"}])
    );
    assert_eq!(out["spec"]["containers"][0]["args"], json!(["other"]));
    assert_eq!(out["spec"]["priorityClassName"], "high");
}

#[test]
fn volumes_and_pull_secrets_merge_by_name() {
    let out = merged(
        base(),
        json!({"spec": {
            "volumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}},
                        {"name": "model", "emptyDir": {"medium": "Memory"}}],
            "imagePullSecrets": [{"name": "regcred"}, {"name": "other"}],
        }}),
    )
    .unwrap();
    assert_eq!(
        out["spec"]["volumes"],
        json!([{"name": "model", "emptyDir": {"medium": "Memory"}},
               {"name": "ca", "configMap": {"name": "ca-bundle"}}])
    );
    assert_eq!(
        out["spec"]["imagePullSecrets"],
        json!([{"name": "regcred"}, {"name": "other"}])
    );
}

#[test]
fn a_keyed_list_the_base_lacks_is_set_and_checked() {
    let out = merged(
        json!({"spec": {"containers": [{"name": "runtime"}]}}),
        json!({"spec": {"topologySpreadConstraints": [
            {"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 1}]}}),
    )
    .unwrap();
    assert_eq!(out["spec"]["topologySpreadConstraints"][0]["maxSkew"], 1);
    let err = merged(
        json!({"spec": {}}),
        json!({"spec": {"volumes": [{"configMap": {"name": "x"}}]}}),
    )
    .unwrap_err();
    assert_eq!(err.field, "spec.volumes[0]");
    assert!(err.message.contains("needs its name"), "{err}");
}

#[test]
fn directives_and_elements_without_their_key_are_refused_naming_the_field() {
    let cases = [
        (json!({"spec": {"$patch": "replace"}}), "spec.$patch"),
        (
            json!({"spec": {"containers": [{"name": "runtime", "$patch": "delete"}]}}),
            "spec.containers[0].$patch",
        ),
        (
            json!({"spec": {"containers": [{"name": "sidecar", "env": [{"$patch": "x"}]}]}}),
            "spec.containers[0].env[0].$patch",
        ),
        (
            json!({"spec": {"$setElementOrder/containers": [{"name": "runtime"}]}}),
            "spec.$setElementOrder/containers",
        ),
        (
            json!({"spec": {"containers": [{"image": "x"}]}}),
            "spec.containers[0]",
        ),
        (
            json!({"spec": {"containers": [{"name": "runtime", "env": [{"value": "1"}]}]}}),
            "spec.containers[0].env[0]",
        ),
    ];
    for (patch, field) in cases {
        let err = merged(base(), patch.clone()).unwrap_err();
        assert_eq!(err.field, field, "{patch}");
    }
}

#[test]
fn an_empty_patch_changes_nothing() {
    assert_eq!(merged(base(), json!({})).unwrap(), base());
}
