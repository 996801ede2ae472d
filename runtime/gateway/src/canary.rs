//! Canary splits (`status.rollout`, written by the operator): which revision a request goes to, and
//! whether a copy of it goes to the canary too (the shadow step).
//!
//! A request's bucket in `0..10000` is a SHA-256 of (a salt, the tenant id, the request's affinity key,
//! the canary revision); it goes to the canary when `bucket < weight · 100`. So a conversation (same
//! tenant, same affinity key) stays on one revision at a fixed weight, raising the weight only moves
//! conversations from stable to canary (never back), every gateway replica agrees, and each new canary
//! revision draws a fresh set of conversations. The mirror uses another salt, so the conversations
//! copied are independent of those split off.
//!
//! Invariants: a deployment has a split only while `canary_revision` names a revision other than the
//! stable one (without a split every Ready pod serves, as before rollouts existed); weights and
//! percents are clamped to 0–100; at weight 0 the canary takes no request of its own (it may still
//! serve as the fallback when stable has no pod to try).

use crate::ring::hash64;
use modelfleet_crds::rollout::RolloutStatus;

/// Buckets per request: a weight of `w` percent is `w · 100` of them.
pub const BUCKETS: u64 = 10_000;
const SPLIT_SALT: &str = "modelfleet/canary-split/v1";
const MIRROR_SALT: &str = "modelfleet/canary-mirror/v1";

/// How a deployment's traffic is divided during a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// The revision serving by default.
    pub stable: String,
    /// The revision being rolled out.
    pub canary: String,
    /// Percent of requests sent to the canary (0–100).
    pub weight: u32,
    /// Percent of stable's requests copied to the canary (0–100).
    pub mirror_percent: u32,
}

/// Which side of a split a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The stable revision.
    Stable,
    /// The canary revision.
    Canary,
}

/// `bytes`' bucket in `0..BUCKETS` under `salt`, from the tenant, the affinity key and the canary.
pub fn bucket(salt: &str, tenant: &str, key: u64, canary: &str) -> u64 {
    let mut bytes = Vec::with_capacity(salt.len() + tenant.len() + canary.len() + 32);
    for part in [
        salt.as_bytes(),
        tenant.as_bytes(),
        &key.to_le_bytes(),
        canary.as_bytes(),
    ] {
        bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
        bytes.extend_from_slice(part);
    }
    hash64(&bytes) % BUCKETS
}

fn percent(v: i32) -> u32 {
    v.clamp(0, 100) as u32
}

impl Split {
    /// The split `status` asks for, if any: a canary revision other than the stable one.
    pub fn from_status(status: Option<&RolloutStatus>) -> Option<Split> {
        let s = status?;
        let canary = s.canary_revision.as_deref()?;
        if s.stable_revision.is_empty() || canary.is_empty() || canary == s.stable_revision {
            return None;
        }
        Some(Split {
            stable: s.stable_revision.clone(),
            canary: canary.to_string(),
            weight: percent(s.weight),
            mirror_percent: percent(s.mirror_percent),
        })
    }

    /// The side of a request of `tenant` with affinity `key`.
    pub fn side(&self, tenant: &str, key: u64) -> Side {
        if bucket(SPLIT_SALT, tenant, key, &self.canary) < u64::from(self.weight) * 100 {
            Side::Canary
        } else {
            Side::Stable
        }
    }

    /// Whether a request of `tenant` with affinity `key`, served by stable, is also copied to the canary.
    pub fn mirrors(&self, tenant: &str, key: u64) -> bool {
        self.side(tenant, key) == Side::Stable
            && bucket(MIRROR_SALT, tenant, key, &self.canary) < u64::from(self.mirror_percent) * 100
    }

    /// The revision of `side`.
    pub fn revision(&self, side: Side) -> &str {
        match side {
            Side::Stable => &self.stable,
            Side::Canary => &self.canary,
        }
    }

    /// The other revision of the split (`rev` is one of them; anything else gets stable).
    pub fn other(&self, rev: &str) -> &str {
        if rev == self.stable {
            &self.canary
        } else {
            &self.stable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use modelfleet_crds::rollout::RolloutPhase;

    fn status(canary: Option<&str>, weight: i32, mirror: i32) -> RolloutStatus {
        RolloutStatus {
            stable_revision: "r1".into(),
            canary_revision: canary.map(Into::into),
            phase: RolloutPhase::Progressing,
            weight,
            mirror_percent: mirror,
            ..Default::default()
        }
    }

    fn split(weight: u32) -> Split {
        Split {
            stable: "r1".into(),
            canary: "r2".into(),
            weight,
            mirror_percent: 0,
        }
    }

    fn keys(n: u64) -> impl Iterator<Item = u64> {
        (0..n).map(|i| hash64(format!("conversation-{i}").as_bytes()))
    }

    #[test]
    fn no_rollout_no_split() {
        assert_eq!(Split::from_status(None), None);
        assert_eq!(Split::from_status(Some(&status(None, 30, 10))), None);
        assert_eq!(Split::from_status(Some(&status(Some("r1"), 30, 0))), None);
        assert_eq!(Split::from_status(Some(&status(Some(""), 30, 0))), None);
        let s = Split::from_status(Some(&status(Some("r2"), 130, -4))).unwrap();
        assert_eq!((s.weight, s.mirror_percent), (100, 0));
        // Starting, rolled back, aborted: a canary named at weight 0 takes nothing of its own.
        let s = Split::from_status(Some(&status(Some("r2"), 0, 0))).unwrap();
        assert!(keys(1000).all(|k| s.side("t", k) == Side::Stable && !s.mirrors("t", k)));
    }

    #[test]
    fn the_bucket_is_deterministic_and_depends_on_every_input() {
        let k = hash64(b"k");
        assert_eq!(bucket(SPLIT_SALT, "t", k, "r2"), bucket(SPLIT_SALT, "t", k, "r2"));
        // Pinned values: another replica, another build, another platform computes the same.
        assert_eq!(bucket(SPLIT_SALT, "t", 42, "r2"), 9394);
        assert_eq!(bucket(MIRROR_SALT, "t", 42, "r2"), 2025);
        let differs = |f: &dyn Fn(u64) -> u64| {
            keys(50)
                .filter(|&k| f(k) != bucket(SPLIT_SALT, "t", k, "r2"))
                .count()
        };
        assert!(differs(&|k| bucket(MIRROR_SALT, "t", k, "r2")) > 45);
        assert!(differs(&|k| bucket(SPLIT_SALT, "u", k, "r2")) > 45);
        assert!(differs(&|k| bucket(SPLIT_SALT, "t", k, "r3")) > 45);
        assert!(keys(1000).all(|k| bucket(SPLIT_SALT, "t", k, "r2") < BUCKETS));
    }

    #[test]
    fn shares_are_within_one_and_a_half_points() {
        for weight in [10, 50] {
            let s = split(weight);
            let canary = keys(10_000)
                .filter(|&k| s.side("tenant-a", k) == Side::Canary)
                .count();
            let share = canary as f64 / 100.0;
            assert!((share - weight as f64).abs() <= 1.5, "weight {weight}: {share}%");
        }
        let mut s = split(0);
        s.mirror_percent = 20;
        let copied = keys(10_000).filter(|&k| s.mirrors("tenant-a", k)).count();
        assert!((copied as f64 / 100.0 - 20.0).abs() <= 1.5, "{copied}");
    }

    #[test]
    fn raising_the_weight_only_moves_conversations_to_the_canary() {
        let all: Vec<u64> = keys(5_000).collect();
        let mut before: Vec<Side> = all.iter().map(|&k| split(0).side("t", k)).collect();
        for weight in [1, 5, 10, 25, 50, 75, 99, 100] {
            let s = split(weight);
            let now: Vec<Side> = all.iter().map(|&k| s.side("t", k)).collect();
            for (b, n) in before.iter().zip(&now) {
                assert!(
                    !(*b == Side::Canary && *n == Side::Stable),
                    "moved back at {weight}"
                );
            }
            // The same key lands on the same side every time at a fixed weight.
            assert!(all.iter().zip(&now).all(|(&k, n)| s.side("t", k) == *n));
            before = now;
        }
        assert!(before.iter().all(|s| *s == Side::Canary));
    }

    #[test]
    fn only_stable_requests_are_mirrored() {
        let mut s = split(50);
        s.mirror_percent = 100;
        for k in keys(1000) {
            assert_eq!(s.mirrors("t", k), s.side("t", k) == Side::Stable);
        }
        assert_eq!(s.other("r1"), "r2");
        assert_eq!(s.other("r2"), "r1");
        assert_eq!(s.revision(Side::Canary), "r2");
    }
}
