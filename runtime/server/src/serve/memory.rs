//! The memory budget a `serve` process sizes its KV pool from, and the pool it buys
//! ([`modelfleet_engine::kv::sizing`] does the arithmetic; this module finds the inputs).
//!
//! Precedence: `--num-kv-blocks` (exact), then `--kv-cache-memory-bytes` (vLLM's flag: KV bytes), then
//! a memory limit for the whole process — `--memory-limit-bytes`, which in a pod the operator fills from
//! the downward API's `limits.memory` through `MODELFLEET_MEMORY_LIMIT_BYTES`; else the cgroup's limit
//! (v2 `memory.max`, v1 `memory.limit_in_bytes`, the tightest along the process's cgroup path) —, and
//! with none of them the default pool. The downward API comes first because it states the container's
//! limit even where the process cannot see its cgroup (the e2e process kubelet has no cgroups).
//!
//! Invariants: an unlimited cgroup (`max`, or v1's "no limit" value near 2^63) is no limit; unreadable
//! cgroup files are skipped, never an error; byte sizes accept plain integers, vLLM's suffixes (`k`, `m`,
//! `g`, `t` decimal; `K`, `M`, `G`, `T` binary) and Kubernetes' binary ones (`Ki`, `Mi`, `Gi`, `Ti`).

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::{KvDType, QuantKind};
use modelfleet_engine::kv::KvGroups;
use modelfleet_engine::kv::sizing::{self, Footprint, KvShape, PoolInputs, PoolPlan, PoolSource};
use std::path::{Path, PathBuf};

/// Values at or above this are cgroup v1's way of saying "no limit" (it reports 2^63 rounded down to
/// a page).
const UNLIMITED: u64 = 1 << 62;

/// The flags that size the pool.
#[derive(Clone, Debug, Default)]
pub struct PoolFlags {
    /// `--num-kv-blocks`.
    pub num_kv_blocks: Option<usize>,
    /// `--kv-cache-memory-bytes`.
    pub kv_cache_memory_bytes: Option<u64>,
    /// `--memory-limit-bytes` (`MODELFLEET_MEMORY_LIMIT_BYTES`, from the downward API in a pod).
    pub memory_limit_bytes: Option<u64>,
}

/// What the pool is sized from, with the cgroup read from the real `/proc` and `/sys/fs/cgroup`.
pub fn pool_source(flags: &PoolFlags) -> PoolSource {
    pool_source_with(flags, Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"))
}

/// [`pool_source`] with the cgroup files taken from `proc_cgroup` and the hierarchy mounted at `root`.
pub fn pool_source_with(flags: &PoolFlags, proc_cgroup: &Path, root: &Path) -> PoolSource {
    if let Some(n) = flags.num_kv_blocks {
        return PoolSource::Blocks(n);
    }
    if let Some(b) = flags.kv_cache_memory_bytes {
        return PoolSource::KvBytes(b);
    }
    if let Some(bytes) = flags.memory_limit_bytes {
        return PoolSource::MemoryLimit {
            bytes,
            origin: "--memory-limit-bytes (MODELFLEET_MEMORY_LIMIT_BYTES: in a pod, the downward API's \
                     limits.memory)"
                .into(),
        };
    }
    match cgroup_limit(proc_cgroup, root) {
        Some((bytes, file)) => PoolSource::MemoryLimit {
            bytes,
            origin: format!("the cgroup ({})", file.display()),
        },
        None => PoolSource::Default,
    }
}

/// The tightest finite memory limit on this process's cgroup path, and the file that set it: cgroup v2
/// (`0::/path` in `/proc/self/cgroup`, `memory.max` from the mount root down the path) or v1 (the
/// `memory` controller's line, `memory/…/memory.limit_in_bytes`).
pub fn cgroup_limit(proc_cgroup: &Path, root: &Path) -> Option<(u64, PathBuf)> {
    let text = std::fs::read_to_string(proc_cgroup).unwrap_or_default();
    let mut candidates: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (base, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // The mount root itself (a cgroup namespace shows the container's own cgroup there), then each
        // directory down the path.
        candidates.push(base.join(file));
        let mut dir = base.clone();
        for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
            dir.push(part);
            candidates.push(dir.join(file));
        }
    }
    candidates
        .into_iter()
        .filter_map(|f| {
            let v = std::fs::read_to_string(&f).ok()?;
            let v: u64 = v.trim().parse().ok()?; // "max" does not parse: no limit
            (v < UNLIMITED).then_some((v, f))
        })
        .min_by_key(|(v, _)| *v)
}

/// Everything besides the source that the pool size follows from.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    /// `--block-size`.
    pub block_size: usize,
    /// The KV cache's element type (`--kv-cache-dtype`).
    pub kv_dtype: KvDType,
    /// `--max-model-len`, if given.
    pub max_model_len: Option<usize>,
    /// `--max-num-seqs`.
    pub max_num_seqs: usize,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: usize,
    /// `--max-lora-rank` (LoRA's step buffers).
    pub max_lora_rank: usize,
}

/// The inputs of the pool arithmetic for `md`: its KV shape, weight bytes as the CPU kernels hold them
/// (as stored, but Q6_K's integer panels: +31%), and the step workspace. A `max_model_len` past the
/// model's limit is clamped here (the engine refuses it with its own message when loading).
pub fn pool_inputs(md: &ModelDir, s: &PoolSettings) -> PoolInputs {
    let c = &md.config;
    inputs_for(c, held_weight_bytes(md), s)
}

/// `md`'s weights as the CPU kernels hold them: as stored, but Q6_K's integer panels (+31%).
fn held_weight_bytes(md: &ModelDir) -> u64 {
    md.weights
        .stored_bytes()
        .iter()
        .map(|(dtype, b)| held_bytes(dtype, *b))
        .sum()
}

/// `bytes` stored in element type `dtype` (its name: `f16`, `q6_K`, …) as the CPU kernels hold them.
pub fn held_bytes(dtype: &str, bytes: u64) -> u64 {
    match QuantKind::ALL.iter().find(|k| k.name() == dtype) {
        Some(&k) => modelfleet_engine::kernels::cpu::held_bytes(k, bytes),
        None => bytes,
    }
}

/// [`pool_inputs`] for a bare config and a weight total (what `plan --config` has).
pub fn inputs_for(c: &modelfleet_engine::model::ModelConfig, weights: u64, s: &PoolSettings) -> PoolInputs {
    let context = s
        .max_model_len
        .unwrap_or(c.max_position_embeddings)
        .min(c.max_position_embeddings);
    let groups = KvGroups::new(&c.layer_windows(context));
    PoolInputs {
        shape: KvShape {
            num_layers: groups.width(),
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            dtype: s.kv_dtype,
        },
        groups,
        step: s.max_num_batched_tokens,
        block_size: s.block_size,
        footprint: Footprint {
            weights,
            workspace: modelfleet_engine::model::workspace_bytes(
                c,
                s.max_num_batched_tokens,
                s.max_num_seqs,
                s.max_lora_rank,
            ),
            draft: 0,
        },
        max_model_len: context,
        max_num_seqs: s.max_num_seqs,
        draft_bytes_per_token: 0,
    }
}

/// The draft KV blocks a speculating server allocates beyond the pool's: each sequence's draft
/// positions (`num_speculative_tokens`, rounded up to blocks, plus one partly filled block).
pub fn draft_extra_blocks(max_num_seqs: usize, num_speculative_tokens: usize, block_size: usize) -> usize {
    max_num_seqs.max(1) * (num_speculative_tokens.div_ceil(block_size.max(1)) + 1)
}

/// `inputs` with a draft model's share of the budget: its weights as held, its step workspace and
/// [`draft_extra_blocks`] in the footprint, and its KV bytes per token beside the pool's (its cache holds
/// the same tokens).
pub fn with_draft(
    mut inputs: PoolInputs,
    draft: &ModelDir,
    num_speculative_tokens: usize,
    s: &PoolSettings,
) -> PoolInputs {
    let c = &draft.config;
    let per_token = KvShape {
        num_layers: c.num_layers,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        dtype: s.kv_dtype,
    }
    .bytes_per_token();
    let weights = held_weight_bytes(draft);
    let workspace = modelfleet_engine::model::workspace_bytes(c, s.max_num_batched_tokens, s.max_num_seqs, 0);
    let extra = draft_extra_blocks(s.max_num_seqs, num_speculative_tokens, s.block_size) as u64
        * per_token
        * s.block_size.max(1) as u64;
    inputs.footprint.draft = weights + workspace + extra;
    inputs.draft_bytes_per_token = per_token;
    inputs
}

/// Sizes the pool for `md`, and for its draft model (with `num_speculative_tokens`) if it has one (see
/// the module header); the error names every number.
pub fn plan(
    md: &ModelDir,
    draft: Option<(&ModelDir, usize)>,
    source: &PoolSource,
    s: &PoolSettings,
) -> modelfleet_engine::Result<PoolPlan> {
    let mut inputs = pool_inputs(md, s);
    if let Some((d, k)) = draft {
        inputs = with_draft(inputs, d, k, s);
    }
    sizing::plan_pool(source, &inputs)
}

/// Parses a byte size: `1073741824`, `1G`/`1Gi` (binary), `1g` (decimal), `25.6k`, `512Mi`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        "K" | "Ki" => 1024.0,
        "M" | "Mi" => 1024f64.powi(2),
        "G" | "Gi" => 1024f64.powi(3),
        "T" | "Ti" => 1024f64.powi(4),
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use k/m/g/t decimal, K/M/G/T or Ki/Mi/Gi/Ti binary)"
            ));
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte size (e.g. 8589934592, 8Gi, 8G, 8g)"))?;
    let v = (n * mult).round();
    if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        for (s, v) in [
            ("1073741824", 1u64 << 30),
            ("1G", 1 << 30),
            ("1Gi", 1 << 30),
            ("1g", 1_000_000_000),
            ("25.6k", 25_600),
            ("512Mi", 512 << 20),
            ("2K", 2048),
        ] {
            assert_eq!(parse_bytes(s), Ok(v), "{s}");
        }
        for bad in ["", "G", "1GB", "-1", "1.2.3", "1e9"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = d.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    fn source(flags: &PoolFlags, d: &tempfile::TempDir) -> PoolSource {
        pool_source_with(flags, &d.path().join("proc-cgroup"), &d.path().join("cg"))
    }

    #[test]
    fn precedence_flags_then_cgroup_then_default() {
        let d = tree(&[
            ("proc-cgroup", "0::/kubepods/pod1/c1\n"),
            ("cg/memory.max", "max\n"),
            ("cg/kubepods/memory.max", "8589934592\n"),
            ("cg/kubepods/pod1/c1/memory.max", "1073741824\n"),
        ]);
        let all = PoolFlags {
            num_kv_blocks: Some(7),
            kv_cache_memory_bytes: Some(1 << 20),
            memory_limit_bytes: Some(1 << 30),
        };
        assert_eq!(source(&all, &d), PoolSource::Blocks(7));
        let bytes = PoolFlags {
            num_kv_blocks: None,
            ..all.clone()
        };
        assert_eq!(source(&bytes, &d), PoolSource::KvBytes(1 << 20));
        let limit = PoolFlags {
            memory_limit_bytes: Some(123),
            ..Default::default()
        };
        assert!(
            matches!(source(&limit, &d), PoolSource::MemoryLimit { bytes: 123, origin } if origin.contains("downward API"))
        );
        match source(&PoolFlags::default(), &d) {
            PoolSource::MemoryLimit { bytes, origin } => {
                assert_eq!(bytes, 1 << 30, "the tightest limit on the path");
                assert!(origin.contains("c1/memory.max"), "{origin}");
            }
            other => panic!("{other:?}"),
        }
        let none = tree(&[("proc-cgroup", "0::/\n"), ("cg/memory.max", "max\n")]);
        assert_eq!(source(&PoolFlags::default(), &none), PoolSource::Default);
        let missing = tree(&[]);
        assert_eq!(source(&PoolFlags::default(), &missing), PoolSource::Default);
    }

    #[test]
    fn cgroup_v1_and_a_namespaced_root() {
        // v1, as on hosts without cgroup namespaces: unlimited at the root, a limit down the path.
        let v1 = tree(&[
            ("proc-cgroup", "9:cpu:/\n4:memory:/process_api/abc\n0::/\n"),
            ("cg/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("cg/memory/process_api/abc/memory.limit_in_bytes", "536870912\n"),
        ]);
        let (v, f) = cgroup_limit(&v1.path().join("proc-cgroup"), &v1.path().join("cg")).unwrap();
        assert_eq!(v, 512 << 20);
        assert!(f.ends_with("process_api/abc/memory.limit_in_bytes"));
        // v2 in a cgroup namespace: the container's limit sits at the mount root.
        let ns = tree(&[("proc-cgroup", "0::/\n"), ("cg/memory.max", "268435456\n")]);
        assert_eq!(
            cgroup_limit(&ns.path().join("proc-cgroup"), &ns.path().join("cg")).map(|x| x.0),
            Some(256 << 20)
        );
    }
}
