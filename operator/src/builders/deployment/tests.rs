//! Tests of the runtime `Deployment` builder.

use super::*;
use crate::builders::fixtures::{DIGEST, md, minimal};

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

#[test]
fn minimal_deployment() {
    let d = desired_deployment(&minimal(), &OperatorConfig::default(), 2).unwrap();
    assert_eq!(d.metadata.name.as_deref(), Some("smollm2"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("serving"));
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("ModelDeployment", Some(true))
    );
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let rolling = spec.strategy.as_ref().unwrap().rolling_update.as_ref().unwrap();
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    let pod = pod_spec(&d);
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        init.args.as_ref().unwrap(),
        &[
            "fetch",
            "--uri",
            "file:///models/smollm2.gguf",
            "--digest",
            DIGEST,
            "--dest",
            MODEL_DIR,
            "--progress-addr",
            "$(POD_IP):8001",
            "--termination-log",
            "/dev/termination-log",
        ],
        "no shared cache unless the namespace opted in"
    );
    let env: Vec<&str> = init.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(
        env,
        ["TMPDIR", "POD_IP"],
        "the progress address expands $(POD_IP)"
    );
    let main = &pod.containers[0];
    assert_eq!(
        main.args.as_ref().unwrap(),
        &[
            "serve",
            "--model",
            MODEL_DIR,
            "--digest",
            DIGEST,
            "--verify-beside-load",
            "--served-model-name",
            "smollm2",
            "--port",
            "8000",
            "--admin-port",
            "8001",
            "--admin-token-file",
            "/etc/modelfleet/admin/token",
            "--adapters-file",
            "/etc/modelfleet/adapters/adapters.json",
            "--adapter-dir",
            "/var/lib/modelfleet/adapters",
            "--termination-log",
            "/dev/termination-log",
            "--max-adapter-bytes",
            "2147483648"
        ]
    );
    let env: Vec<&str> = main
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(env, ["POD_IP", "POD_NAME", "POD_NAMESPACE", "TMPDIR"]);
    assert_eq!(
        main.readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/ready")
    );
    assert_eq!(
        main.liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/health")
    );
    let annotations = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations[DIGEST_ANNOTATION], DIGEST);
    let volumes: Vec<&str> = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(
        volumes,
        ["model", "admin-token", "adapters", "adapter-store", "tmp"]
    );
}

#[test]
fn containers_are_locked_down_and_volumes_bounded() {
    let cfg = OperatorConfig {
        model_volume_size_limit: Some("20Gi".into()),
        ..Default::default()
    };
    let d = desired_deployment(&minimal(), &cfg, 1).unwrap();
    let pod = pod_spec(&d);
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_non_root, psc.run_as_user, psc.fs_group),
        (Some(true), Some(65532), Some(65532))
    );
    assert_eq!(psc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let init = &pod.init_containers.as_ref().unwrap()[0];
    for c in [init, &pod.containers[0]] {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            (
                sc.allow_privilege_escalation,
                sc.read_only_root_filesystem,
                sc.privileged,
                sc.run_as_non_root
            ),
            (Some(false), Some(true), Some(false), Some(true)),
            "{}",
            c.name
        );
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert!(mounts.iter().any(|m| m.mount_path == TMP_DIR), "{}", c.name);
    }
    let limit = |name: &str| {
        let v = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == name)
            .unwrap();
        v.empty_dir
            .as_ref()
            .unwrap()
            .size_limit
            .as_ref()
            .map(|q| q.0.clone())
    };
    assert_eq!(limit("model").as_deref(), Some("20Gi"));
    assert_eq!(limit("adapter-store").as_deref(), Some("2Gi"));
    assert_eq!(limit("tmp").as_deref(), Some(TMP_SIZE_LIMIT));
    let fetch_args = init.args.as_ref().unwrap().join(" ");
    assert!(fetch_args.contains("--max-bytes 21474836480"), "{fetch_args}");
    // A terminating pod serves on for the preStop delay, within the grace period.
    let pre_stop = pod.containers[0]
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap();
    assert_eq!(pre_stop.sleep.as_ref().unwrap().seconds, 5);
    assert_eq!(pod.termination_grace_period_seconds, Some(65));
    let none = OperatorConfig {
        pre_stop_seconds: 0,
        ..Default::default()
    };
    let d = desired_deployment(&minimal(), &none, 1).unwrap();
    assert!(pod_spec(&d).containers[0].lifecycle.is_none());
}

#[test]
fn the_shared_cache_is_mounted_only_in_namespaces_that_opted_in() {
    use crate::config::NamespaceSet;
    let has_cache = |namespaces: NamespaceSet| {
        let cfg = OperatorConfig {
            model_cache_namespaces: namespaces,
            ..Default::default()
        };
        let d = desired_deployment(&minimal(), &cfg, 1).unwrap();
        let pod = pod_spec(&d);
        let volume = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "model-cache");
        let flag = pod.init_containers.as_ref().unwrap()[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--cache".to_string());
        assert_eq!(volume, flag);
        volume
    };
    assert!(!has_cache(NamespaceSet::None));
    assert!(!has_cache(NamespaceSet::Listed(vec!["other".into()])));
    assert!(has_cache(NamespaceSet::Listed(vec!["serving".into()])));
    assert!(has_cache(NamespaceSet::All));
}

#[test]
fn spec_fields_become_flags_mounts_and_resources() {
    let md = md(&format!(
        "  model:\n    uri: hf://org/m@v1\n    digest: \"{DIGEST}\"\n    servedName: chat\n  runtime:\n    \
         image: registry/runtime:v2\n    threads: 4\n    maxNumSeqs: 64\n    queue:\n      maxNumQueuedReqs: 100\n    \
         kvCache:\n      blockSize: 32\n      dtype: q8_0\n    prefixCaching:\n      enabled: true\n      scope: Deployment\n    \
         resources:\n      limits:\n        nvidia.com/gpu: \"1\"\n    extraArgs: [\"--seed-base\", \"7\"]\n    \
         env:\n    - name: RUST_LOG\n      value: debug\n  tenants:\n    secretRef:\n      name: keys\n"
    ));
    let cfg = OperatorConfig {
        model_cache: ModelCache::Pvc("models".into()),
        model_cache_namespaces: crate::config::NamespaceSet::All,
        ..Default::default()
    };
    let d = desired_deployment(&md, &cfg, 1).unwrap();
    let pod = pod_spec(&d);
    let main = &pod.containers[0];
    assert_eq!(main.image.as_deref(), Some("registry/runtime:v2"));
    let args = main.args.as_ref().unwrap().join(" ");
    for expected in [
        "--served-model-name chat",
        "--tenants /etc/modelfleet/tenants/tenants.yaml",
        "--threads 4",
        "--max-num-seqs 64",
        "--max-num-queued-reqs 100",
        "--block-size 32",
        "--kv-cache-dtype q8_0",
        "--enable-prefix-caching --prefix-cache-scope deployment",
    ] {
        assert!(args.contains(expected), "{expected:?} missing from {args}");
    }
    assert!(args.ends_with("--seed-base 7"), "extra args go last: {args}");
    let limits = main.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    assert!(main.env.as_ref().unwrap().iter().any(|e| e.name == "RUST_LOG"));
    let tenants = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "tenants")
        .unwrap();
    assert_eq!(
        tenants.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("keys")
    );
    let mount = main
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "tenants")
        .unwrap();
    assert!(
        mount.sub_path.is_none(),
        "a subPath mount would not see Secret rotation"
    );
    let cache = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "model-cache")
        .unwrap();
    assert_eq!(
        cache.persistent_volume_claim.as_ref().unwrap().claim_name,
        "models"
    );
}

#[test]
fn no_cache_means_no_cache_flag_or_volume() {
    let cfg = OperatorConfig {
        model_cache: ModelCache::None,
        ..Default::default()
    };
    let d = desired_deployment(&minimal(), &cfg, 1).unwrap();
    let pod = pod_spec(&d);
    assert!(
        !pod.init_containers.as_ref().unwrap()[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--cache".to_string())
    );
    assert!(
        pod.volumes
            .as_ref()
            .unwrap()
            .iter()
            .all(|v| v.name != "model-cache")
    );
}

#[test]
fn speculative_config_becomes_the_flag_and_a_draft_model_a_verified_fetch() {
    let ngram = md(&format!(
        "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    speculativeConfig:\n      \
         method: Ngram\n      numSpeculativeTokens: 4\n      promptLookupMax: 5\n      disableByBatchSize: 8\n"
    ));
    let args = serve_args(
        &ngram,
        ngram.spec.runtime.as_ref().unwrap(),
        &OperatorConfig::default(),
    );
    let i = args.iter().position(|a| a == "--speculative-config").unwrap();
    let doc: serde_json::Value = serde_json::from_str(&args[i + 1]).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,
                           "disable_by_batch_size": 8})
    );
    assert_eq!(
        pod_spec(&desired_deployment(&ngram, &OperatorConfig::default(), 1).unwrap())
            .init_containers
            .as_ref()
            .unwrap()
            .len(),
        1
    );
    let draft_digest = format!("sha256:{}", "b".repeat(64));
    let draft = md(&format!(
        "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    speculativeConfig:\n      \
         method: DraftModel\n      numSpeculativeTokens: 3\n      draftModel:\n        uri: hf://org/small@v1\n        \
         digest: \"{draft_digest}\"\n"
    ));
    let d = desired_deployment(&draft, &OperatorConfig::default(), 1).unwrap();
    let pod = pod_spec(&d);
    let fetch = &pod.init_containers.as_ref().unwrap()[1];
    assert_eq!(fetch.name, FETCH_DRAFT_CONTAINER);
    let fa = fetch.args.as_ref().unwrap().join(" ");
    assert!(
        fa.contains(&format!(
            "--uri hf://org/small@v1 --digest {draft_digest} --dest {DRAFT_DIR}"
        )),
        "{fa}"
    );
    let args = pod.containers[0].args.as_ref().unwrap();
    let i = args.iter().position(|a| a == "--speculative-config").unwrap();
    let doc: serde_json::Value = serde_json::from_str(&args[i + 1]).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({"method": "draft_model", "num_speculative_tokens": 3, "model": DRAFT_DIR,
                           "model_digest": draft_digest})
    );
    let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m.name == "draft-model" && m.mount_path == DRAFT_DIR && m.read_only == Some(true))
    );
    assert!(
        pod.volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "draft-model")
    );
}

#[test]
fn prefix_caching_off() {
    let md = md(&format!(
        "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    prefixCaching:\n      enabled: false\n"
    ));
    let args = serve_args(&md, md.spec.runtime.as_ref().unwrap(), &OperatorConfig::default());
    assert!(args.contains(&"--no-enable-prefix-caching".to_string()));
    assert!(!args.contains(&"--prefix-cache-scope".to_string()));
}

#[test]
fn adapters_come_from_a_mounted_directory_and_never_restart_pods() {
    let d = desired_deployment(&minimal(), &OperatorConfig::default(), 1).unwrap();
    let pod = pod_spec(&d);
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "adapters")
        .unwrap();
    let cm = volume.config_map.as_ref().unwrap();
    assert_eq!(cm.name, "smollm2-adapters");
    assert_eq!(cm.optional, None, "a pod never starts without its adapter list");
    let store = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "adapter-store")
        .unwrap();
    assert!(store.empty_dir.is_some());
    let main = &pod.containers[0];
    let mounts = main.volume_mounts.as_ref().unwrap();
    let m = mounts.iter().find(|m| m.name == "adapters").unwrap();
    assert_eq!(
        (m.mount_path.as_str(), m.read_only, m.sub_path.as_deref()),
        (ADAPTERS_DIR, Some(true), None),
        "a directory mount (not subPath) so ConfigMap updates reach running pods"
    );
    let s = mounts.iter().find(|m| m.name == "adapter-store").unwrap();
    assert_eq!((s.mount_path.as_str(), s.read_only), (ADAPTER_STORE_DIR, None));
    let annotations = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap();
    assert!(
        annotations
            .keys()
            .all(|k| !k.contains("adapter") && !k.contains("config")),
        "no ConfigMap hash in the pod template: {annotations:?}"
    );
    let args = main.args.as_ref().unwrap();
    assert!(
        !args.contains(&"--adapter-file-roots".to_string()),
        "none by default"
    );
}

#[test]
fn a_memory_limit_reaches_the_runtime_through_the_downward_api() {
    let with_limit = md(&format!(
        "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n  runtime:\n    resources:\n      limits:\n        \
         memory: 2Gi\n      requests:\n        memory: 1Gi\n"
    ));
    let d = desired_deployment(&with_limit, &OperatorConfig::default(), 1).unwrap();
    let main = &pod_spec(&d).containers[0];
    let env = main
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "MODELFLEET_MEMORY_LIMIT_BYTES")
        .expect("the limit is passed");
    let field = env
        .value_from
        .as_ref()
        .unwrap()
        .resource_field_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (field.container_name.as_deref(), field.resource.as_str()),
        (Some(RUNTIME_CONTAINER), "limits.memory")
    );
    assert!(
        env.value.is_none() && field.divisor.is_none(),
        "bytes, from the API server"
    );
    // Without a limit the downward API would report the node's memory: nothing is passed, and the
    // runtime falls back to its cgroup or its default pool.
    for spec in [
        "",
        "  runtime:\n    resources:\n      requests:\n        memory: 1Gi\n",
    ] {
        let m = md(&format!(
            "  model:\n    uri: file:///m\n    digest: \"{DIGEST}\"\n{spec}"
        ));
        let d = desired_deployment(&m, &OperatorConfig::default(), 1).unwrap();
        let env = pod_spec(&d).containers[0].env.clone().unwrap();
        assert!(
            env.iter().all(|e| e.name != "MODELFLEET_MEMORY_LIMIT_BYTES"),
            "{spec}"
        );
    }
}

#[test]
fn adapter_file_roots_are_the_operators_setting() {
    let cfg = OperatorConfig {
        adapter_file_roots: vec!["/srv/adapters".into(), "/mnt/shared".into()],
        ..Default::default()
    };
    let d = desired_deployment(&minimal(), &cfg, 1).unwrap();
    let args = pod_spec(&d).containers[0].args.as_ref().unwrap().join(" ");
    assert!(
        args.contains("--adapter-file-roots /srv/adapters,/mnt/shared"),
        "{args}"
    );
}

#[test]
fn node_file_roots_are_mounted_read_only_at_their_paths_in_fetch_and_runtime() {
    let none = desired_deployment(&minimal(), &OperatorConfig::default(), 1).unwrap();
    let volumes = pod_spec(&none).volumes.clone().unwrap_or_default();
    assert!(
        !volumes.iter().any(|v| v.name.starts_with("node-files")),
        "no node files mounted unless asked"
    );
    let cfg = OperatorConfig {
        node_file_roots: vec!["/srv/models".into(), "/mnt/adapters".into()],
        ..Default::default()
    };
    let d = desired_deployment(&minimal(), &cfg, 1).unwrap();
    let pod = pod_spec(&d);
    let paths: Vec<(String, String)> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v.name.clone(), v.host_path.as_ref()?.path.clone())))
        .filter(|(n, _)| n.starts_with("node-files"))
        .collect();
    assert_eq!(
        paths,
        [
            ("node-files-0".to_string(), "/srv/models".to_string()),
            ("node-files-1".to_string(), "/mnt/adapters".to_string())
        ]
    );
    let containers = pod.init_containers.iter().flatten().chain(pod.containers.iter());
    for c in containers {
        let mounts = c.volume_mounts.as_ref().unwrap();
        for (i, root) in ["/srv/models", "/mnt/adapters"].iter().enumerate() {
            let m = mounts
                .iter()
                .find(|m| m.name == format!("node-files-{i}"))
                .unwrap_or_else(|| panic!("{} mounts {root}", c.name));
            assert_eq!(m.mount_path, *root);
            assert_eq!(m.read_only, Some(true), "{} mounts {root} read-only", c.name);
        }
    }
}

#[test]
fn node_file_roots_are_mounted_only_in_the_namespaces_listed() {
    let with = |entries: &[&str]| OperatorConfig {
        node_file_roots: vec!["/srv/models".into()],
        node_file_namespaces: crate::config::NamespaceSet::parse(
            &entries.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        ),
        ..Default::default()
    };
    let mounts = |cfg: &OperatorConfig| {
        let d = desired_deployment(&minimal(), cfg, 1).unwrap();
        pod_spec(&d)
            .volumes
            .iter()
            .flatten()
            .filter(|v| v.host_path.is_some())
            .count()
    };
    // minimal() lives in namespace "serving".
    for (entries, expected) in [
        (&["*"][..], 1),
        (&["serving"][..], 1),
        (&["serv*"][..], 1),
        (&["team-*", "other"][..], 0),
        (&[][..], 0),
    ] {
        assert_eq!(mounts(&with(entries)), expected, "{entries:?}");
    }
}

#[test]
fn the_runtime_image_its_pull_policy_and_pull_secrets_come_from_the_operator() {
    let cfg = OperatorConfig {
        runtime_image: "registry.example/modelfleet/runtime@sha256:ab".into(),
        runtime_image_pull_policy: Some("Always".into()),
        image_pull_secrets: vec!["regcred".into()],
        ..OperatorConfig::default()
    };
    let d = desired_deployment(&minimal(), &cfg, 1).unwrap();
    let pod = pod_spec(&d);
    let secrets: Vec<&str> = pod
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["regcred"]);
    for c in pod.containers.iter().chain(pod.init_containers.iter().flatten()) {
        assert_eq!(
            c.image.as_deref(),
            Some("registry.example/modelfleet/runtime@sha256:ab"),
            "{}",
            c.name
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"), "{}", c.name);
    }
    // None given: Kubernetes' defaults, nothing written.
    let d = desired_deployment(&minimal(), &OperatorConfig::default(), 1).unwrap();
    assert!(pod_spec(&d).image_pull_secrets.is_none());
    assert!(pod_spec(&d).containers[0].image_pull_policy.is_none());
}

/// An image volume: the node mounts the model image's `/models`; the fetch container checks it in
/// place (`--mounted`), with the signature key and credentials mounted into it alone, and the
/// credentials are also the pod's pull secret.
#[test]
fn a_model_image_is_an_image_volume_checked_in_place() {
    let m = md(&format!(
        "  model:\n    uri: oci://reg.example:5000/models/m:v1@sha256:{h}\n    digest: \"{DIGEST}\"\n    \
         delivery: ImageVolume\n    credentialsSecretRef: {{name: pull}}\n    verify:\n      \
         publicKeySecretRef: {{name: keys}}\n",
        h = "2".repeat(64)
    ));
    let d = desired_deployment(&m, &OperatorConfig::default(), 1).unwrap();
    let pod = pod_spec(&d);
    let model = pod.volumes.iter().flatten().find(|v| v.name == "model").unwrap();
    let image = model.image.as_ref().expect("an image volume");
    assert_eq!(
        image.reference.as_deref(),
        Some(format!("reg.example:5000/models/m@sha256:{}", "2".repeat(64)).as_str()),
        "pinned by the manifest digest, the tag dropped"
    );
    let init = &pod.init_containers.as_ref().unwrap()[0];
    let args = init.args.as_ref().unwrap();
    let after = |flag: &str| args[args.iter().position(|a| a == flag).unwrap() + 1].as_str();
    assert_eq!(after("--mounted"), MODEL_DIR);
    assert!(!args.contains(&"--dest".to_string()));
    assert_eq!(after("--public-key"), "/etc/modelfleet/model-key/cosign.pub");
    assert_eq!(after("--credentials-dir"), "/etc/modelfleet/source-credentials");
    let mounts = |c: &Container| -> Vec<(String, String, Option<String>, Option<bool>)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                (
                    m.name.clone(),
                    m.mount_path.clone(),
                    m.sub_path.clone(),
                    m.read_only,
                )
            })
            .collect()
    };
    let model_mount = (
        "model".to_string(),
        MODEL_DIR.to_string(),
        Some("models".to_string()),
        Some(true),
    );
    assert!(mounts(init).contains(&model_mount));
    assert!(mounts(&pod.containers[0]).contains(&model_mount));
    let secret_mounts = ["model-credentials", "model-key"];
    assert!(
        secret_mounts
            .iter()
            .all(|s| mounts(init).iter().any(|m| m.0 == *s))
    );
    assert!(
        !mounts(&pod.containers[0])
            .iter()
            .any(|m| secret_mounts.contains(&m.0.as_str())),
        "the runtime never sees credentials or keys"
    );
    let pulls: Vec<&str> = pod
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(pulls, ["pull"]);
}

/// A claim: mounted read-only at the path on it, for the fetch container's check and the runtime.
#[test]
fn a_claim_is_mounted_read_only_at_its_path() {
    let m = md(&format!(
        "  model:\n    uri: pvc://shared/models/m\n    digest: \"{DIGEST}\"\n"
    ));
    let d = desired_deployment(&m, &OperatorConfig::default(), 1).unwrap();
    let pod = pod_spec(&d);
    let claim = pod.volumes.iter().flatten().find(|v| v.name == "model").unwrap();
    let pvc = claim.persistent_volume_claim.as_ref().unwrap();
    assert_eq!((pvc.claim_name.as_str(), pvc.read_only), ("shared", Some(true)));
    for c in [&pod.init_containers.as_ref().unwrap()[0], &pod.containers[0]] {
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "model")
            .unwrap();
        assert_eq!(
            (mount.sub_path.as_deref(), mount.read_only),
            (Some("models/m"), Some(true))
        );
    }
    assert!(
        pod.init_containers.as_ref().unwrap()[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--mounted".to_string())
    );
}

#[test]
fn a_declared_task_reaches_the_runtime_as_its_flag() {
    let mut m = minimal();
    let args = |m: &ModelDeployment| {
        let d = desired_deployment(m, &OperatorConfig::default(), 1).unwrap();
        pod_spec(&d).containers[0].args.clone().unwrap()
    };
    assert!(
        !args(&m).iter().any(|a| a == "--task"),
        "unset: the model's files decide"
    );
    m.spec.model.task = Some(modelfleet_crds::model_source::ModelTask::Embed);
    let a = args(&m);
    let i = a.iter().position(|x| x == "--task").expect("--task passed");
    assert_eq!(a[i + 1], "embed");
}
