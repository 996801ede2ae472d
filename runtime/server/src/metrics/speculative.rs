//! Speculative decoding metrics under vLLM's names — `vllm:spec_decode_num_drafts_total`,
//! `vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total` and
//! `vllm:spec_decode_num_accepted_tokens_per_pos_total{position}` (labels `model_name` and `engine`
//! = "0", as vLLM's other metrics here) — and their
//! `modelfleet_` twins (label `model`): `modelfleet_spec_decode_drafts_total`,
//! `modelfleet_spec_decode_draft_tokens_total`, `modelfleet_spec_decode_accepted_tokens_total`,
//! `modelfleet_spec_decode_accepted_tokens_per_position_total{position}`; and, ours alone, what the
//! step-cost gate decided: `modelfleet_spec_decode_proposed_tokens_total` (draft tokens on offer
//! before it) and `modelfleet_spec_decode_gate_kept_tokens_total` (those it kept).
//!
//! Acceptance rate = accepted ÷ draft tokens; mean accepted run = accepted ÷ drafts; the per-position
//! counters show how far runs get (position 0 is the first draft of a run).
//!
//! Invariants: the counters copy the step loop's cumulative counters at scrape time (they only grow);
//! both names of a quantity always carry the same value.

use modelfleet_api::metric_names as names;
use modelfleet_engine::speculative::SpecCounters;
use prometheus::{IntCounterVec, Opts, Registry};

/// One counter of ours alone (label `model`).
fn single(registry: &Registry, name: &str, help: &str) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), &["model"]).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric names");
    c
}

/// One quantity under both names.
struct Twin {
    ours: IntCounterVec,
    vllm: IntCounterVec,
}

impl Twin {
    fn new(registry: &Registry, ours: &str, vllm: &str, help: &str, extra: Option<&str>) -> Self {
        let ours_labels: Vec<&str> = std::iter::once("model").chain(extra).collect();
        let vllm_labels: Vec<&str> = ["model_name", "engine"].into_iter().chain(extra).collect();
        let t = Self {
            ours: IntCounterVec::new(Opts::new(ours, help), &ours_labels).expect("valid metric"),
            vllm: IntCounterVec::new(Opts::new(vllm, format!("{help} (vLLM's name)")), &vllm_labels)
                .expect("valid metric"),
        };
        registry
            .register(Box::new(t.ours.clone()))
            .expect("unique metric names");
        registry
            .register(Box::new(t.vllm.clone()))
            .expect("unique metric names");
        t
    }

    /// Raises both counters of `model` (and `extra`, e.g. the position) to `value`.
    fn set(&self, model: &str, extra: Option<&str>, value: u64) {
        let ours: Vec<&str> = std::iter::once(model).chain(extra).collect();
        let vllm: Vec<&str> = [model, "0"].into_iter().chain(extra).collect();
        for (c, labels) in [(&self.ours, ours), (&self.vllm, vllm)] {
            let c = c.with_label_values(&labels);
            c.inc_by(value.saturating_sub(c.get()));
        }
    }
}

/// The speculative decoding metrics of one server.
pub struct SpecMetrics {
    model: String,
    drafts: Twin,
    draft_tokens: Twin,
    accepted: Twin,
    per_position: Twin,
    proposed: IntCounterVec,
    kept: IntCounterVec,
}

impl SpecMetrics {
    /// Registers the metrics in `registry`, labelled with the served model name.
    pub fn new(registry: &Registry, model: &str) -> Self {
        Self {
            model: model.to_owned(),
            drafts: Twin::new(
                registry,
                names::SPEC_DECODE_DRAFTS,
                names::VLLM_SPEC_DECODE_DRAFTS,
                "Speculative verification runs with at least one drafted token",
                None,
            ),
            draft_tokens: Twin::new(
                registry,
                names::SPEC_DECODE_DRAFT_TOKENS,
                names::VLLM_SPEC_DECODE_DRAFT_TOKENS,
                "Drafted tokens verified",
                None,
            ),
            accepted: Twin::new(
                registry,
                names::SPEC_DECODE_ACCEPTED_TOKENS,
                names::VLLM_SPEC_DECODE_ACCEPTED_TOKENS,
                "Drafted tokens accepted",
                None,
            ),
            per_position: Twin::new(
                registry,
                names::SPEC_DECODE_ACCEPTED_PER_POSITION,
                names::VLLM_SPEC_DECODE_ACCEPTED_PER_POSITION,
                "Drafted tokens accepted, by position in their run (0 = first draft)",
                Some("position"),
            ),
            proposed: single(
                registry,
                names::SPEC_DECODE_PROPOSED_TOKENS,
                "Draft tokens on offer before the step-cost gate",
            ),
            kept: single(
                registry,
                names::SPEC_DECODE_KEPT_TOKENS,
                "Draft tokens the step-cost gate kept",
            ),
        }
    }

    /// Copies the step loop's counters.
    pub fn refresh(&self, c: &SpecCounters) {
        let m = self.model.as_str();
        self.drafts.set(m, None, c.drafts);
        self.draft_tokens.set(m, None, c.draft_tokens);
        self.accepted.set(m, None, c.accepted_tokens);
        for (pos, &n) in c.accepted_per_position.iter().enumerate() {
            self.per_position.set(m, Some(&pos.to_string()), n);
        }
        for (counter, value) in [(&self.proposed, c.proposed_tokens), (&self.kept, c.kept_tokens)] {
            let counter = counter.with_label_values(&[m]);
            counter.inc_by(value.saturating_sub(counter.get()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_names_carry_the_counters() {
        let r = Registry::new();
        let m = SpecMetrics::new(&r, "tiny");
        let mut c = SpecCounters::default();
        c.record(4, 2);
        c.record(3, 3);
        c.proposed_tokens = 9;
        c.kept_tokens = 7;
        m.refresh(&c);
        m.refresh(&c); // idempotent: cumulative values, not increments
        let mut buf = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        for line in [
            "modelfleet_spec_decode_drafts_total{model=\"tiny\"} 2",
            "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"tiny\"} 2",
            "modelfleet_spec_decode_draft_tokens_total{model=\"tiny\"} 7",
            "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"tiny\"} 7",
            "modelfleet_spec_decode_accepted_tokens_total{model=\"tiny\"} 5",
            "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"tiny\"} 5",
            "modelfleet_spec_decode_accepted_tokens_per_position_total{model=\"tiny\",position=\"0\"} 2",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",model_name=\"tiny\",position=\"2\"} 1",
            "modelfleet_spec_decode_proposed_tokens_total{model=\"tiny\"} 9",
            "modelfleet_spec_decode_gate_kept_tokens_total{model=\"tiny\"} 7",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
