//! The pod settings as data: a ModelDeployment's (and the chart's defaults') fields → the runtime pod
//! template, and each change to what the operator owns refused naming the layer and the field.

use super::*;
use crate::builders::deployment::desired_deployment;
use crate::builders::fixtures::{DIGEST, md};
use crate::config::{NamespaceSet, OperatorConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;
use modelfleet_crds::ModelDeployment;

/// A ModelDeployment whose `spec.runtime` is `runtime` (YAML, indented by 4).
fn with_runtime(runtime: &str) -> ModelDeployment {
    md(&format!(
        "  model:\n    uri: file:///models/m.gguf\n    digest: \"{DIGEST}\"\n  runtime:\n{runtime}"
    ))
}

fn settings(yaml: &str) -> PodSettings {
    serde_saphyr::from_str(yaml).expect("pod settings parse")
}

fn built(md: &ModelDeployment, cfg: &OperatorConfig) -> Deployment {
    desired_deployment(md, cfg, 1).expect("a pod template")
}

fn pod(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn refused(md: &ModelDeployment, cfg: &OperatorConfig) -> PodTemplateError {
    desired_deployment(md, cfg, 1).expect_err("refused")
}

#[test]
fn without_pod_settings_the_template_is_the_operators_and_merging_nothing_is_lossless() {
    let plain = with_runtime("    threads: 2\n");
    let template = built(&plain, &OperatorConfig::default()).spec.unwrap().template;
    let none = PodSettings::default();
    assert_eq!(place(template.clone(), &none, &none).unwrap(), template);
    let empty_overlay = settings("podTemplate: {}\n");
    assert_eq!(
        place(template.clone(), &none, &empty_overlay).unwrap(),
        template,
        "through JSON and back"
    );
}

#[test]
fn typed_fields_reach_the_pod() {
    let md = with_runtime(
        "    nodeSelector: {pool: avx512}\n    tolerations:\n    - {key: dedicated, operator: Equal, value: \
         inference, effect: NoSchedule}\n    affinity:\n      podAntiAffinity:\n        \
         requiredDuringSchedulingIgnoredDuringExecution:\n        - labelSelector: {matchLabels: \
         {app.kubernetes.io/instance: smollm2}}\n          topologyKey: kubernetes.io/hostname\n    \
         topologySpreadConstraints:\n    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, \
         whenUnsatisfiable: ScheduleAnyway}\n    priorityClassName: inference-high\n    runtimeClassName: \
         sandboxed\n    imagePullSecrets: [{name: team-regcred}]\n    serviceAccountName: model-reader\n    \
         podLabels: {team: ml}\n    podAnnotations: {cost-center: \"42\"}\n    volumes:\n    - name: ca\n      \
         configMap: {name: ca-bundle}\n    volumeMounts:\n    - {name: ca, mountPath: /etc/ssl/custom, readOnly: \
         true}\n",
    );
    let cfg = OperatorConfig {
        image_pull_secrets: vec!["regcred".into()],
        ..Default::default()
    };
    let d = built(&md, &cfg);
    let p = pod(&d);
    assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "avx512");
    assert_eq!(
        p.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    assert!(p.affinity.as_ref().unwrap().pod_anti_affinity.is_some());
    assert_eq!(p.topology_spread_constraints.as_ref().unwrap()[0].max_skew, 1);
    assert_eq!(p.priority_class_name.as_deref(), Some("inference-high"));
    assert_eq!(p.runtime_class_name.as_deref(), Some("sandboxed"));
    assert_eq!(p.service_account_name.as_deref(), Some("model-reader"));
    assert_eq!(
        p.automount_service_account_token,
        Some(false),
        "still the operator's"
    );
    let secrets: Vec<&str> = p
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["regcred", "team-regcred"], "beside the operator's");
    let meta = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap();
    assert_eq!(meta.labels.as_ref().unwrap()["team"], "ml");
    assert_eq!(
        meta.labels.as_ref().unwrap()["app.kubernetes.io/instance"],
        "smollm2"
    );
    assert_eq!(meta.annotations.as_ref().unwrap()["cost-center"], "42");
    assert!(
        meta.annotations
            .as_ref()
            .unwrap()
            .contains_key("prometheus.io/scrape")
    );
    let volumes = p.volumes.as_ref().unwrap();
    assert_eq!(volumes[0].name, "model", "the operator's first");
    assert_eq!(volumes.last().unwrap().name, "ca");
    let mounts = p.containers[0].volume_mounts.as_ref().unwrap();
    assert_eq!(mounts.last().unwrap().mount_path, "/etc/ssl/custom");
    assert!(mounts.iter().any(|m| m.name == "model"));
    assert!(
        p.init_containers.as_ref().unwrap()[0]
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.name != "ca"),
        "mounted into the runtime container only"
    );
}

#[test]
fn the_chart_defaults_lie_beneath_a_deployments_own_as_a_strategic_merge() {
    let cfg = OperatorConfig {
        pod_defaults: settings(
            "nodeSelector: {pool: inference, zone: a}\ntolerations: [{key: pool, operator: Exists}]\n\
             priorityClassName: fleet\npodLabels: {owner: platform}\nvolumes: [{name: ca, configMap: {name: \
             ca-bundle}}]\nvolumeMounts: [{name: ca, mountPath: /etc/ssl/custom}]\n",
        ),
        ..Default::default()
    };
    let bare = built(&with_runtime("    threads: 1\n"), &cfg);
    assert_eq!(pod(&bare).priority_class_name.as_deref(), Some("fleet"));
    assert_eq!(pod(&bare).volumes.as_ref().unwrap().last().unwrap().name, "ca");
    let own = with_runtime(
        "    nodeSelector: {pool: avx512}\n    tolerations: [{key: avx512, operator: Exists}]\n    \
         podLabels: {team: ml}\n    volumes: [{name: scratch, emptyDir: {}}]\n    volumeMounts: [{name: \
         scratch, mountPath: /scratch}]\n",
    );
    let d = built(&own, &cfg);
    let p = pod(&d);
    let selector = p.node_selector.as_ref().unwrap();
    assert_eq!(
        (selector["pool"].as_str(), selector["zone"].as_str()),
        ("avx512", "a"),
        "maps merge"
    );
    let keys: Vec<_> = p
        .tolerations
        .iter()
        .flatten()
        .map(|t| t.key.clone().unwrap())
        .collect();
    assert_eq!(keys, ["avx512"], "tolerations replace");
    assert_eq!(
        p.priority_class_name.as_deref(),
        Some("fleet"),
        "kept where not set"
    );
    let names: Vec<_> = p.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    assert!(
        names.ends_with(&["ca", "scratch"]),
        "volumes merge by name: {names:?}"
    );
    let labels = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(
        (labels["owner"].as_str(), labels["team"].as_str()),
        ("platform", "ml")
    );
}

#[test]
fn the_overlay_goes_last_and_reaches_what_no_typed_field_does() {
    let md = with_runtime(
        "    nodeSelector: {pool: a}\n    podTemplate:\n      metadata:\n        annotations: {sidecar: \
         \"yes\"}\n      spec:\n        nodeSelector: {pool: b}\n        dnsPolicy: None\n        \
         dnsConfig: {nameservers: [10.0.0.10]}\n        automountServiceAccountToken: true\n        \
         containers:\n        - name: runtime\n          env: [{name: HTTPS_PROXY, value: \"http://proxy:3128\"}]\n          \
         resources: {requests: {cpu: \"2\"}}\n        - name: proxy\n          image: envoy:v1\n        \
         initContainers:\n        - name: warm\n          image: busybox\n",
    );
    let d = built(&md, &OperatorConfig::default());
    let p = pod(&d);
    assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "b");
    assert_eq!(p.dns_policy.as_deref(), Some("None"));
    assert_eq!(p.automount_service_account_token, Some(true));
    let names: Vec<&str> = p.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["runtime", "proxy"]);
    let runtime = &p.containers[0];
    let env: Vec<&str> = runtime.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env.first(), Some(&"POD_IP"));
    assert_eq!(env.last(), Some(&"HTTPS_PROXY"));
    assert!(runtime.args.as_ref().unwrap().contains(&"serve".to_string()));
    assert!(runtime.readiness_probe.is_some());
    let inits: Vec<&str> = p
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(inits, ["fetch", "warm"]);
}

/// Pod settings that change what the operator owns → the layer and the field named.
const OWNED: [(&str, &str, &str); 14] = [
    (
        "    podLabels: {app.kubernetes.io/instance: other}\n",
        RUNTIME,
        "metadata.labels.app.kubernetes.io/instance",
    ),
    (
        "    podLabels: {modelfleet.io/revision: x}\n",
        RUNTIME,
        "metadata.labels.modelfleet.io/revision",
    ),
    (
        "    podAnnotations: {modelfleet.io/model-digest: x}\n",
        RUNTIME,
        "metadata.annotations.modelfleet.io/model-digest",
    ),
    (
        "    volumes: [{name: model, emptyDir: {}}]\n",
        RUNTIME,
        "spec.volumes[model]",
    ),
    (
        "    volumes: [{name: tenants, emptyDir: {}}]\n",
        RUNTIME,
        "spec.volumes[tenants]",
    ),
    (
        "    volumes: [{name: x, emptyDir: {}}]\n    volumeMounts: [{name: x, mountPath: /var/lib/modelfleet/model/x}]\n",
        RUNTIME,
        "spec.containers[runtime].volumeMounts",
    ),
    (
        "    podTemplate: {spec: {containers: [{name: runtime, args: [serve, --model, /elsewhere]}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[runtime].args",
    ),
    (
        "    podTemplate: {spec: {containers: [{name: runtime, command: [/bin/sh]}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[runtime].command",
    ),
    (
        "    podTemplate: {spec: {containers: [{name: runtime, ports: [{containerPort: 9000}]}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[runtime].ports",
    ),
    (
        "    podTemplate: {spec: {containers: [{name: runtime, readinessProbe: {tcpSocket: {port: 8000}}}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[runtime].readinessProbe",
    ),
    (
        "    podTemplate: {spec: {initContainers: [{name: fetch, image: other}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.initContainers[fetch].image",
    ),
    (
        "    podTemplate: {spec: {containers: [{name: fetch-draft, image: x}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[fetch-draft]",
    ),
    (
        "    podTemplate: {spec: {containers: null}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[runtime]",
    ),
    (
        "    podTemplate: {spec: {containers: [{name: runtime, $patch: replace}]}}\n",
        RUNTIME_TEMPLATE,
        "spec.containers[0].$patch",
    ),
];

#[test]
fn changes_to_what_the_operator_owns_are_refused_naming_layer_and_field() {
    for (runtime, layer, field) in OWNED {
        let e = refused(&with_runtime(runtime), &OperatorConfig::default());
        assert_eq!(
            (e.layer.as_str(), e.field.as_str()),
            (layer, field),
            "{runtime}: {e}"
        );
    }
}

#[test]
fn a_bad_default_is_named_as_the_charts() {
    let cfg = OperatorConfig {
        pod_defaults: settings("podTemplate: {spec: {volumes: [{name: model, emptyDir: {}}]}}\n"),
        ..Default::default()
    };
    let e = refused(&with_runtime("    threads: 1\n"), &cfg);
    assert_eq!(
        (e.layer.as_str(), e.field.as_str()),
        (DEFAULTS_TEMPLATE, "spec.volumes[model]")
    );
    assert!(check_defaults(&cfg).is_err());
    assert!(check_defaults(&OperatorConfig::default()).is_ok());
}

#[test]
fn a_mount_needs_a_volume_from_some_layer() {
    let e = refused(
        &with_runtime("    volumeMounts: [{name: ca, mountPath: /etc/ssl/custom}]\n"),
        &OperatorConfig::default(),
    );
    assert!(e.message.contains("mounts volume \"ca\""), "{e}");
    let cfg = OperatorConfig {
        pod_defaults: settings("volumes: [{name: ca, configMap: {name: ca-bundle}}]\n"),
        ..Default::default()
    };
    built(
        &with_runtime("    volumeMounts: [{name: ca, mountPath: /etc/ssl/custom}]\n"),
        &cfg,
    );
}

#[test]
fn a_template_that_is_no_pod_template_is_refused() {
    let e = refused(
        &with_runtime("    podTemplate: {spec: {terminationGracePeriodSeconds: soon}}\n"),
        &OperatorConfig::default(),
    );
    assert_eq!(e.layer, RUNTIME_TEMPLATE);
    assert!(e.message.contains("is not a pod template"), "{e}");
}

/// Every container and volume the builder makes is one the CRD's rules protect, whatever the spec.
#[test]
fn the_crds_protected_names_cover_everything_the_builder_makes() {
    let specs = [
        format!(
            "  model:\n    uri: oci://r.example/m@sha256:{h}\n    digest: \"{DIGEST}\"\n    delivery: ImageVolume\n    \
             credentialsSecretRef: {{name: creds}}\n    verify: {{publicKeySecretRef: {{name: key}}}}\n  tenants:\n    \
             secretRef: {{name: keys}}\n",
            h = "a".repeat(64)
        ),
        format!(
            "  model:\n    uri: pvc://models/m\n    digest: \"{DIGEST}\"\n  runtime:\n    speculativeConfig:\n      \
             method: DraftModel\n      numSpeculativeTokens: 3\n      draftModel:\n        uri: hf://o/d@v1\n        \
             digest: \"{DIGEST}\"\n"
        ),
    ];
    let cfg = OperatorConfig {
        model_cache_namespaces: NamespaceSet::All,
        node_file_roots: vec!["/srv/models".into(), "/srv/adapters".into()],
        ..Default::default()
    };
    for spec in specs {
        let d = built(&md(&spec), &cfg);
        let p = pod(&d);
        for c in p.containers.iter().chain(p.init_containers.iter().flatten()) {
            assert!(OPERATOR_CONTAINERS.contains(&c.name.as_str()), "{}", c.name);
            for m in c.volume_mounts.iter().flatten() {
                assert!(is_owned_path(&m.mount_path) || is_owned_volume(&m.name), "{m:?}");
            }
        }
        for v in p.volumes.iter().flatten() {
            assert!(is_owned_volume(&v.name), "{}", v.name);
        }
    }
}

/// A canary runs the spec's template, placement included; stable keeps the one it has.
#[test]
fn the_canary_gets_the_placement() {
    use crate::rollout::plan::{label_revision, plan};
    use modelfleet_crds::rollout::{RolloutPhase, RolloutStatus};
    let before = built(&with_runtime("    threads: 1\n"), &OperatorConfig::default());
    let mut desired = built(
        &with_runtime("    threads: 1\n    tolerations: [{key: pool, operator: Exists}]\n"),
        &OperatorConfig::default(),
    );
    label_revision(&mut desired);
    let status = RolloutStatus {
        phase: RolloutPhase::Progressing,
        weight: 10,
        ..Default::default()
    };
    let p = plan("smollm2", &desired, Some(&before), &status, 2);
    let canary = p.canary.expect("a canary");
    assert!(pod(&canary).tolerations.is_some());
    assert!(pod(&p.stable).tolerations.is_none());
}
