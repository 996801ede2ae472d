//! Consistent hashing with bounded loads (CHWBL; Mirrokni, Thorup, Zadimoghaddam 2016, as Vimeo and
//! HAProxy use it): each pod owns [`VNODES`] points on a 64-bit ring; a request's affinity key hashes
//! to a point, and the pods are visited clockwise from it. The first pod whose load leaves room under
//! the bound takes the request; a pod is passed over when `load + 1 > max(⌈c · (total + 1) / n⌉, f)`
//! (c the load factor, n the eligible pods, f the floor). If none has room (possible only with
//! fractional loads), the least loaded eligible pod takes it.
//!
//! The floor is ours, not the paper's: with a few requests in flight the plain bound is 1 or 2, so two
//! concurrent requests of one tenant would already push the second off its home pod — and a batching
//! replica serves a few requests at once for little more than one, while the pod it overflows to has to
//! prefill the whole prefix again and evict another tenant's to hold it. Below `f` a pod keeps its keys.
//!
//! Invariants: the ring is a pure function of the set of pod names (SHA-256 of `name#i`), so every
//! gateway replica — and every restart — sends a key to the same pod while loads are within bounds;
//! adding or removing one pod moves only the keys of the arcs it gains or loses; the walk visits each
//! pod exactly once.

use sha2::{Digest, Sha256};

/// Points per pod. A pod's share of the ring deviates from 1/n by about 1/√VNODES of itself: at 160
/// points that was ±8% (one standard deviation), enough to put 1.5× as many unique prompts on one of
/// three pods as on another in one run in ten; at 1,024 it is ±3%. Building a ring of 100 pods hashes
/// 102,400 names (tens of milliseconds), once per change of the pod set.
pub const VNODES: usize = 1024;

/// The 64-bit ring position of `bytes`.
pub fn hash64(bytes: &[u8]) -> u64 {
    let d = Sha256::digest(bytes);
    u64::from_be_bytes(d[..8].try_into().expect("SHA-256 has 32 bytes"))
}

/// The ring over one deployment's pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// (position, pod index), sorted by position.
    points: Vec<(u64, u32)>,
    /// Pod names, sorted; a pod's index is its place here.
    pods: Vec<String>,
}

/// Why a pod was chosen (the `decision` label of `modelfleet_gateway_route_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The key's home pod (the first eligible one on the ring).
    Affinity,
    /// Another pod: the home pod was over the bound.
    Overflow,
    /// The only eligible pod.
    Only,
}

impl Decision {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Decision::Affinity => "affinity",
            Decision::Overflow => "overflow",
            Decision::Only => "only",
        }
    }
}

impl Ring {
    /// The ring of `pods` (order and duplicates do not matter).
    pub fn new<S: AsRef<str>>(pods: &[S]) -> Ring {
        let mut names: Vec<String> = pods.iter().map(|p| p.as_ref().to_string()).collect();
        names.sort();
        names.dedup();
        let mut points = Vec::with_capacity(names.len() * VNODES);
        for (i, name) in names.iter().enumerate() {
            for v in 0..VNODES {
                points.push((hash64(format!("{name}#{v}").as_bytes()), i as u32));
            }
        }
        points.sort_unstable();
        Ring { points, pods: names }
    }

    /// The pod names, in index order.
    pub fn pods(&self) -> &[String] {
        &self.pods
    }

    /// Pod indices in ring order from `key`'s position, each once.
    pub fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|(h, _)| *h < key);
        let mut seen = vec![false; self.pods.len()];
        let mut left = self.pods.len();
        (0..self.points.len())
            .map(move |i| self.points[(start + i) % self.points.len()].1 as usize)
            .filter(move |&p| {
                if left == 0 || seen[p] {
                    return false;
                }
                seen[p] = true;
                left -= 1;
                true
            })
    }

    /// Chooses the pod for `key` among those `eligible` accepts, given each pod's `load` (requests in
    /// flight, possibly fractional) and the factor `c` (≥ 1).
    pub fn choose(
        &self,
        key: u64,
        eligible: impl Fn(usize) -> bool,
        load: impl Fn(usize) -> f64,
        c: f64,
        floor: f64,
    ) -> Option<(usize, Decision)> {
        let candidates: Vec<usize> = self.walk(key).filter(|&p| eligible(p)).collect();
        match candidates.len() {
            0 => return None,
            1 => return Some((candidates[0], Decision::Only)),
            _ => {}
        }
        let loads: Vec<f64> = candidates.iter().map(|&p| load(p).max(0.0)).collect();
        let total: f64 = loads.iter().sum();
        let bound = (c * (total + 1.0) / candidates.len() as f64).ceil().max(floor);
        let fits = candidates
            .iter()
            .zip(&loads)
            .position(|(_, l)| l + 1.0 <= bound + 1e-9);
        let at = fits.unwrap_or_else(|| {
            (0..loads.len())
                .min_by(|&a, &b| loads[a].total_cmp(&loads[b]))
                .expect("at least two candidates")
        });
        let decision = if at == 0 {
            Decision::Affinity
        } else {
            Decision::Overflow
        };
        Some((candidates[at], decision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("fleet-7d9f-{i:02}")).collect()
    }

    #[test]
    fn two_instances_agree_and_order_does_not_matter() {
        let mut shuffled = names(5);
        shuffled.reverse();
        let (a, b) = (Ring::new(&names(5)), Ring::new(&shuffled));
        assert_eq!(a, b);
        for k in 0..1000u64 {
            let key = hash64(&k.to_le_bytes());
            let pa = a.choose(key, |_| true, |_| 0.0, 1.25, 0.0).unwrap();
            let pb = b.choose(key, |_| true, |_| 0.0, 1.25, 0.0).unwrap();
            assert_eq!(a.pods()[pa.0], b.pods()[pb.0]);
            assert_eq!(pa.1, Decision::Affinity);
        }
    }

    #[test]
    fn walk_visits_every_pod_once() {
        let r = Ring::new(&names(7));
        for key in [0, u64::MAX, 12345, hash64(b"x")] {
            let mut w: Vec<usize> = r.walk(key).collect();
            assert_eq!(w.len(), 7);
            w.sort();
            assert_eq!(w, (0..7).collect::<Vec<_>>());
        }
        assert_eq!(Ring::new::<String>(&[]).walk(5).count(), 0);
    }

    #[test]
    fn keys_spread_evenly_and_few_move_when_a_pod_joins() {
        let three = Ring::new(&names(3));
        let four = Ring::new(&names(4));
        let mut count: HashMap<String, usize> = HashMap::new();
        let mut moved = 0;
        let n = 30_000;
        for k in 0..n as u64 {
            let key = hash64(&k.to_be_bytes());
            let p3 = &three.pods()[three.walk(key).next().unwrap()];
            let p4 = &four.pods()[four.walk(key).next().unwrap()];
            *count.entry(p3.clone()).or_default() += 1;
            if p3 != p4 {
                moved += 1;
                assert_eq!(p4, &names(4)[3], "a key moved between old pods");
            }
        }
        let (min, max) = (count.values().min().unwrap(), count.values().max().unwrap());
        assert!(*max as f64 / *min as f64 <= 1.12, "{count:?}");
        // The new pod takes about a quarter of the keys, from the others.
        assert!((moved as f64 / n as f64 - 0.25).abs() < 0.06, "{moved}");
    }

    /// Each pod's share of the ring's length (its arcs end at its points).
    fn shares(r: &Ring) -> Vec<f64> {
        let mut share = vec![0.0; r.pods().len()];
        let mut prev = r.points.last().unwrap().0;
        for &(h, p) in &r.points {
            share[p as usize] += h.wrapping_sub(prev) as f64 / 2f64.powi(64);
            prev = h;
        }
        share
    }

    #[test]
    fn every_pod_set_shares_the_ring_within_a_few_percent() {
        // Pod names as a Deployment makes them: a template hash and a random suffix. Over 200 sets of
        // three, no pod's share strays more than 12% from a third (the spread is ±3% per pod).
        let mut worst: f64 = 0.0;
        for set in 0..200u64 {
            let pods: Vec<String> = (0..3)
                .map(|i| {
                    format!(
                        "roll-68cd9f4b67-{:05x}",
                        hash64(&(set * 3 + i).to_le_bytes()) >> 44
                    )
                })
                .collect();
            for s in shares(&Ring::new(&pods)) {
                worst = worst.max((s * 3.0 - 1.0).abs());
            }
        }
        assert!(worst < 0.12, "worst relative deviation {worst}");
    }

    #[test]
    fn a_pod_over_the_bound_is_passed_over() {
        let r = Ring::new(&names(3));
        let key = hash64(b"tenant-a");
        let home = r.walk(key).next().unwrap();
        // Home at 4 in flight, others idle: total 4, bound ⌈1.25·5/3⌉ = 3, 4 + 1 > 3.
        let load = |p: usize| if p == home { 4.0 } else { 0.0 };
        let (p, d) = r.choose(key, |_| true, load, 1.25, 0.0).unwrap();
        assert_ne!(p, home);
        assert_eq!(d, Decision::Overflow);
        assert_eq!(p, r.walk(key).nth(1).unwrap(), "the next pod clockwise");
        // Within the bound it stays home: loads (home 1, next 1, last 0), total 2, bound
        // ⌈1.25·3/3⌉ = 2, and 1 + 1 fits.
        let next = r.walk(key).nth(1).unwrap();
        let load = |p: usize| if p == home || p == next { 1.0 } else { 0.0 };
        let (p, d) = r.choose(key, |_| true, load, 1.25, 0.0).unwrap();
        assert_eq!((p, d), (home, Decision::Affinity));
    }

    #[test]
    fn below_the_floor_a_pod_keeps_its_keys() {
        let r = Ring::new(&names(3));
        let key = hash64(b"tenant-a");
        let home = r.walk(key).next().unwrap();
        // Home at 2, others idle: the plain bound ⌈1.25·3/3⌉ = 2 passes it over; a floor of 4 keeps it.
        let load = |p: usize| if p == home { 2.0 } else { 0.0 };
        assert_eq!(
            r.choose(key, |_| true, load, 1.25, 0.0).unwrap().1,
            Decision::Overflow
        );
        let (p, d) = r.choose(key, |_| true, load, 1.25, 4.0).unwrap();
        assert_eq!((p, d), (home, Decision::Affinity));
        // At the floor (3 + 1 = 4 fits, 4 + 1 does not) it overflows again.
        let load = |p: usize| if p == home { 4.0 } else { 0.0 };
        assert_eq!(
            r.choose(key, |_| true, load, 1.25, 4.0).unwrap().1,
            Decision::Overflow
        );
    }

    #[test]
    fn eligibility_and_fallback() {
        let r = Ring::new(&names(3));
        let key = hash64(b"k");
        let home = r.walk(key).next().unwrap();
        let (p, d) = r.choose(key, |p| p == home, |_| 100.0, 1.25, 0.0).unwrap();
        assert_eq!((p, d), (home, Decision::Only));
        assert_eq!(r.choose(key, |_| false, |_| 0.0, 1.25, 0.0), None);
        // Fractional loads with no pod fitting: the least loaded takes it.
        let loads = [2.5, 2.2, 2.4];
        let (p, _) = r.choose(key, |_| true, |p| loads[p], 1.0, 0.0).unwrap();
        assert_eq!(p, 1);
    }

    #[test]
    fn bounded_loads_keep_the_busiest_pod_near_the_mean() {
        // Sequential placement with departures: hot keys (one tenant) must not pile onto one pod.
        let r = Ring::new(&names(3));
        let mut load = [0.0f64; 3];
        for i in 0..300u64 {
            let key = if i % 2 == 0 {
                hash64(b"hot")
            } else {
                hash64(&i.to_be_bytes())
            };
            let (p, _) = r.choose(key, |_| true, |p| load[p], 1.25, 0.0).unwrap();
            load[p] += 1.0;
            let total: f64 = load.iter().sum();
            let max = load.iter().cloned().fold(0.0, f64::max);
            assert!(max <= (1.25 * total / 3.0).ceil() + 1.0, "{load:?}");
        }
    }
}
