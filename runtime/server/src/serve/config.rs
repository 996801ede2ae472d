//! [`RuntimeConfig`]: everything `serve` runs with, checked and built in one place by
//! [`ServeArgs::validate`] before anything starts — the engine, scheduler, queue, KV-pool, request,
//! body, adapter-registry and listener settings. A bad combination of flags fails here, naming the
//! flags and the limits, before a byte of the model is read.
//!
//! Invariants: `max_num_seqs` and `max_loras` are read once and given to both the engine and the
//! scheduler (which must agree); nothing here does I/O except reading the speculative config's JSON
//! from its flag.

use super::args::ServeArgs;
use super::memory::{PoolFlags, PoolSettings};
use super::params::RequestLimits;
use super::state::{BodyLimits, CacheScope};
use crate::adapters::UriPolicy;
use crate::adapters::startup::StartupPolicy;
use anyhow::bail;
use modelfleet_api::listener::Limits as ListenerLimits;
use modelfleet_engine::EngineConfig;
use modelfleet_engine::sched::{QueueLimits, SchedulerConfig};
use std::path::PathBuf;
use std::time::Duration;

/// A model whose bytes must match a digest before it is served (the target, or a draft model).
#[derive(Clone, Debug)]
pub struct Artifact {
    /// What the error messages call it (`the model`, `the draft model`).
    pub what: &'static str,
    /// Its path.
    pub path: PathBuf,
    /// The canonical digest it must have, when one is given.
    pub digest: Option<String>,
}

/// The adapter registry's settings (the store directory is chosen at start: `--adapter-dir`, else a
/// temporary one).
#[derive(Clone, Debug)]
pub struct RegistrySettings {
    /// `--max-cpu-loras` (default `--max-loras`).
    pub max_cpu_loras: usize,
    /// `--max-lora-rank`.
    pub max_lora_rank: usize,
    /// Requests waiting for an adapter to load (`--max-num-queued-reqs`).
    pub max_waiting: usize,
    /// `--adapter-dir`.
    pub dir: Option<PathBuf>,
    /// `--adapter-uri-schemes`, `--adapter-file-roots`.
    pub policy: UriPolicy,
    /// `--hf-endpoint`.
    pub hf_endpoint: String,
    /// `--max-adapter-bytes`, `--adapter-fetch-timeout-seconds`.
    pub fetch_limits: crate::fetch::Limits,
    /// `--adapters-file` and how its entries load.
    pub startup: Option<(PathBuf, StartupPolicy)>,
}

/// Where and how the two listeners run.
#[derive(Clone, Debug)]
pub struct ListenSettings {
    /// `--host`, else `$POD_IP`, else loopback.
    pub host: String,
    /// `--port`.
    pub port: u16,
    /// `--admin-port`.
    pub admin_port: u16,
    /// The API port's bounds (`--max-connections`, `--header-read-timeout`).
    pub api: ListenerLimits,
    /// The admin port's: its own connection budget, so tenants' connections never blind the
    /// operator, Prometheus or the probes there.
    pub admin: ListenerLimits,
}

/// Everything `serve` runs with.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The name clients put in `model`.
    pub served_name: String,
    /// The model, and the draft model with speculative decoding by a draft model.
    pub model: Artifact,
    /// The draft model and its drafts per step.
    pub draft: Option<(Artifact, usize)>,
    /// Check the digests beside the load rather than before it (`--verify-beside-load`).
    pub verify_beside_load: bool,
    /// The engine (its KV pool still to be sized from the memory budget at load).
    pub engine: EngineConfig,
    /// Which float matrices run on bf16 dot products.
    pub bf16_dot: modelfleet_engine::kernels::cpu::Bf16Dot,
    /// The step loop's scheduler.
    pub scheduler: SchedulerConfig,
    /// The admission queue's bounds.
    pub queue: QueueLimits,
    /// What sizes the KV pool, and the arithmetic's inputs.
    pub pool: (PoolFlags, PoolSettings),
    /// Per-request bounds.
    pub limits: RequestLimits,
    /// Request bodies' bounds.
    pub body: BodyLimits,
    /// Sequences one tenant may have waiting.
    pub tenant_queue_share: usize,
    /// Prefix-cache sharing.
    pub scope: CacheScope,
    /// LoRA adapters.
    pub registry: RegistrySettings,
    /// The listeners.
    pub listen: ListenSettings,
    /// In-flight requests' time to finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// `--tenants`.
    pub tenants: Option<PathBuf>,
    /// `--admin-token-file`.
    pub admin_token_file: Option<PathBuf>,
    /// `--enable-fault-injection`.
    pub fault_injection: bool,
    /// `--fault-error-percent` and `--fault-delay-ms` (0 unless fault injection is on).
    pub fault_error_percent: u32,
    pub fault_delay: Duration,
    /// `--termination-log`.
    pub termination_log: Option<PathBuf>,
    /// `--task`: what the model must do (unset: what its files say).
    pub task: Option<super::args::Task>,
}

impl ServeArgs {
    /// Checks every flag and what they mean together, and builds the configuration `serve` runs with.
    pub fn validate(&self) -> anyhow::Result<RuntimeConfig> {
        self.check_ranges()?;
        let spec = self
            .speculative_config
            .as_deref()
            .map(super::speculative::parse)
            .transpose()?;
        let (max_num_seqs, max_loras) = (self.max_num_seqs, self.max_loras);
        let kv_cache_dtype = self.kv_cache_dtype.kv_dtype();
        let draft = spec.as_ref().and_then(|s| {
            let path = s.draft.clone()?;
            let artifact = Artifact {
                what: "the draft model",
                path,
                digest: s.draft_digest.clone(),
            };
            Some((artifact, s.config.num_speculative_tokens))
        });
        Ok(RuntimeConfig {
            served_name: self.served_name(),
            model: Artifact {
                what: "the model",
                path: self.model.clone(),
                digest: self.digest.clone(),
            },
            draft,
            verify_beside_load: self.verify_beside_load,
            bf16_dot: self.bf16_dot.mode(),
            engine: EngineConfig {
                threads: self.threads,
                block_size: self.block_size,
                num_kv_blocks: None,
                max_model_len: self.max_model_len,
                max_num_seqs,
                max_loras,
                kv_cache_dtype,
            },
            scheduler: SchedulerConfig {
                max_num_seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                enable_prefix_caching: !self.no_enable_prefix_caching,
                max_loras,
                speculative: spec.as_ref().map(|s| s.config),
            },
            queue: QueueLimits {
                max_queued_requests: self.max_num_queued_reqs,
                max_queued_tokens: self.max_num_queued_tokens,
            },
            pool: self.pool(),
            limits: RequestLimits {
                max_timeout_secs: self.max_request_timeout,
                max_sequences: self.max_sequences_per_request,
                max_cache_salt_bytes: self.max_cache_salt_bytes,
                ..RequestLimits::default()
            },
            body: BodyLimits {
                max_bytes: self.max_body_bytes,
                read_timeout: Duration::from_secs_f64(self.body_read_timeout),
            },
            tenant_queue_share: self
                .max_num_queued_reqs_per_tenant
                .unwrap_or(if self.tenants.is_some() {
                    (self.max_num_queued_reqs / 2).max(self.max_sequences_per_request)
                } else {
                    self.max_num_queued_reqs
                }),
            scope: self.prefix_cache_scope,
            registry: self.registry_settings(),
            listen: self.listen_settings(),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            tenants: self.tenants.clone(),
            admin_token_file: self.admin_token_file.clone(),
            fault_injection: self.enable_fault_injection,
            fault_error_percent: self.fault_error_percent,
            fault_delay: Duration::from_millis(self.fault_delay_ms),
            termination_log: self.termination_log.clone(),
            task: self.task,
        })
    }

    /// The flags with ranges, each naming itself and its limit.
    fn check_ranges(&self) -> anyhow::Result<()> {
        let max_cpu_loras = self.max_cpu_loras.unwrap_or(self.max_loras);
        if self.max_loras == 0 || max_cpu_loras < self.max_loras || !(1..=512).contains(&self.max_lora_rank) {
            bail!(
                "--max-loras must be >= 1 (got {}), --max-cpu-loras >= --max-loras (got {max_cpu_loras}), \
                 --max-lora-rank in [1, 512] (got {})",
                self.max_loras,
                self.max_lora_rank
            );
        }
        for (flag, secs) in [
            ("--body-read-timeout", self.body_read_timeout),
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
        ] {
            if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
                bail!("{flag} must be in (0, 3600] seconds, got {secs}");
            }
        }
        if (self.fault_error_percent > 0 || self.fault_delay_ms > 0) && !self.enable_fault_injection {
            bail!("--fault-error-percent and --fault-delay-ms need --enable-fault-injection");
        }
        if self.fault_error_percent > 100 || self.fault_delay_ms > 600_000 {
            bail!(
                "--fault-error-percent must be in [0, 100] (got {}), --fault-delay-ms at most 600000 (got {})",
                self.fault_error_percent,
                self.fault_delay_ms
            );
        }
        if self.max_connections == 0 || self.max_sequences_per_request == 0 {
            bail!("--max-connections and --max-sequences-per-request must be >= 1");
        }
        if let Some(bad) = self
            .adapter_uri_schemes
            .iter()
            .find(|s| !["file", "http", "https", "hf"].contains(&s.as_str()))
        {
            bail!("--adapter-uri-schemes: unknown scheme {bad:?} (use file, http, https, hf)");
        }
        Ok(())
    }

    /// What sizes the KV pool (the flags, else the memory limit) and the arithmetic's inputs.
    fn pool(&self) -> (PoolFlags, PoolSettings) {
        let flags = PoolFlags {
            num_kv_blocks: self.num_kv_blocks,
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            memory_limit_bytes: self.memory_limit_bytes,
        };
        let settings = PoolSettings {
            block_size: self.block_size,
            kv_dtype: self.kv_cache_dtype.kv_dtype(),
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_lora_rank: self.max_lora_rank,
        };
        (flags, settings)
    }

    /// `--served-model-name`, else the model path's last component without `.gguf`.
    fn served_name(&self) -> String {
        self.served_model_name.clone().unwrap_or_else(|| {
            self.model
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
                .unwrap_or_else(|| "model".into())
        })
    }

    fn registry_settings(&self) -> RegistrySettings {
        RegistrySettings {
            max_cpu_loras: self.max_cpu_loras.unwrap_or(self.max_loras),
            max_lora_rank: self.max_lora_rank,
            max_waiting: self.max_num_queued_reqs,
            dir: self.adapter_dir.clone(),
            policy: UriPolicy {
                schemes: self.adapter_uri_schemes.clone(),
                file_roots: self.adapter_file_roots.clone(),
            },
            hf_endpoint: self.hf_endpoint.clone(),
            fetch_limits: crate::fetch::Limits {
                max_bytes: self.max_adapter_bytes,
                timeout: Some(Duration::from_secs(self.adapter_fetch_timeout_seconds.max(1))),
            },
            startup: self.adapters_file.clone().map(|file| {
                let policy = StartupPolicy {
                    concurrency: self.startup_adapter_concurrency.max(1),
                    deadline: Duration::from_secs(self.startup_adapter_deadline_seconds),
                };
                (file, policy)
            }),
        }
    }

    fn listen_settings(&self) -> ListenSettings {
        let api = ListenerLimits {
            max_connections: self.max_connections,
            header_read_timeout: Duration::from_secs_f64(self.header_read_timeout),
            idle_timeout: Duration::from_secs_f64(self.idle_timeout),
            ..ListenerLimits::default()
        };
        ListenSettings {
            host: modelfleet_api::listener::host_or_pod_ip(self.host.as_deref()),
            port: self.port,
            admin_port: self.admin_port,
            admin: ListenerLimits {
                max_connections: 256,
                ..api.clone()
            },
            api,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn args(extra: &[&str]) -> ServeArgs {
        let argv = ["serve", "--model", "/m/smollm2.gguf"].iter().chain(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn one_place_builds_every_config_and_engine_and_scheduler_agree() {
        let c = args(&["--max-num-seqs", "12", "--max-loras", "3", "--tenants", "/t.yaml"])
            .validate()
            .unwrap();
        assert_eq!(c.served_name, "smollm2");
        assert_eq!((c.engine.max_num_seqs, c.scheduler.max_num_seqs), (12, 12));
        assert_eq!((c.engine.max_loras, c.scheduler.max_loras), (3, 3));
        assert_eq!(c.pool.1.max_num_seqs, 12);
        assert_eq!(c.registry.max_cpu_loras, 3);
        // With a tenants file no tenant may hold more than half the queue.
        assert_eq!(c.tenant_queue_share, 128);
        assert_eq!(c.listen.admin.max_connections, 256);
        assert!(c.draft.is_none());
    }

    #[test]
    fn bad_combinations_name_the_flags() {
        let e = |extra: &[&str]| args(extra).validate().err().unwrap().to_string();
        assert!(e(&["--max-loras", "0"]).contains("--max-loras must be >= 1"));
        assert!(e(&["--max-loras", "4", "--max-cpu-loras", "2"]).contains("--max-cpu-loras >= --max-loras"));
        assert!(e(&["--body-read-timeout", "0"]).contains("--body-read-timeout must be in (0, 3600]"));
        assert!(e(&["--adapter-uri-schemes", "ftp"]).contains("unknown scheme \"ftp\""));
        assert!(e(&["--speculative-config", "{}"]).contains("num_speculative_tokens is required"));
    }
}
