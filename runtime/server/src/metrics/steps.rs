//! Where the step loop's time goes, per `model`: `modelfleet_engine_steps_total` (model steps run),
//! `modelfleet_engine_step_positions_total` (positions the steps computed: prompt tokens, decoded
//! tokens and speculative verification positions alike), `modelfleet_engine_model_seconds_total`
//! (in the target model's forward pass and sampling), `modelfleet_engine_schedule_seconds_total`
//! (scheduling and building batches) and `modelfleet_engine_draft_seconds_total` (in a draft model's
//! passes; 0 without one); for time to first token, `modelfleet_engine_prefill_steps_total` (steps
//! that computed prompt chunks), `modelfleet_engine_prefill_positions_total` (the prompt positions
//! they computed) and the gauge `modelfleet_engine_step_token_budget` (`--max-num-batched-tokens`:
//! positions one step may compute); for speculative decoding, the decode-shaped steps split in two —
//! `modelfleet_engine_decode_{steps,positions,seconds}_total` (nothing drafted) and
//! `modelfleet_engine_verify_{steps,positions,seconds}_total` (at least one sequence verifying drafts)
//! — so seconds ÷ steps of each kind is what a verification step costs against a plain one on this
//! machine and model, the figure the step-cost gate (`speculative::cost`) decides by.
//!
//! TTFT is queue time (`modelfleet_queue_time_seconds`) plus the steps that carry the prompt. Prefill
//! positions ÷ prefill steps against the budget says whether a burst's prompts are chunked at the
//! budget (TTFT then grows with the burst: each step is one budget's worth of compute) or whether
//! steps carry less than the budget allows; model seconds ÷ positions prices a position.
//!
//! With the token counters they split a throughput figure: positions ÷ generated tokens is the work
//! a token costs (above 1 when verification positions are rejected or prompts are long), model
//! seconds ÷ positions what a position costs on this machine, and wall time minus the three the
//! time the loop waited for work. Speculative decoding pays when it lowers model seconds per
//! generated token.
//!
//! Invariants: the counters copy the step loop's cumulative figures at scrape time, so they only
//! grow.

use prometheus::{CounterVec, IntCounterVec, Opts, Registry};

/// The integer counters, in [`StepTotals::ints`]' order: (name, help).
const INTS: [(&str, &str); 8] = [
    (
        "modelfleet_engine_steps_total",
        "Model steps run by the step loop",
    ),
    (
        "modelfleet_engine_step_positions_total",
        "Positions computed by model steps (prompt, decoded and verification positions)",
    ),
    (
        "modelfleet_engine_prefill_steps_total",
        "Model steps that computed prompt chunks",
    ),
    (
        "modelfleet_engine_prefill_positions_total",
        "Prompt positions computed by model steps",
    ),
    (
        "modelfleet_engine_decode_steps_total",
        "Decode-shaped model steps with nothing drafted",
    ),
    (
        "modelfleet_engine_decode_positions_total",
        "Positions computed by decode steps without drafts",
    ),
    (
        "modelfleet_engine_verify_steps_total",
        "Decode-shaped model steps in which at least one sequence verified drafts",
    ),
    (
        "modelfleet_engine_verify_positions_total",
        "Positions computed by verification steps (drafts included)",
    ),
];

/// The seconds counters, in [`StepTotals::secs`]' order: (name, help).
const SECS: [(&str, &str); 5] = [
    (
        "modelfleet_engine_model_seconds_total",
        "Seconds in the target model's forward passes and sampling",
    ),
    (
        "modelfleet_engine_schedule_seconds_total",
        "Seconds scheduling and building batches",
    ),
    (
        "modelfleet_engine_draft_seconds_total",
        "Seconds in a draft model's passes",
    ),
    (
        "modelfleet_engine_decode_seconds_total",
        "Seconds in decode steps without drafts",
    ),
    (
        "modelfleet_engine_verify_seconds_total",
        "Seconds in verification steps",
    ),
];

/// The step-loop counters of one server.
pub struct StepMetrics {
    model: String,
    ints: Vec<IntCounterVec>,
    secs: Vec<CounterVec>,
}

/// The step loop's cumulative figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTotals {
    /// Model steps run.
    pub steps: u64,
    /// Positions computed by them.
    pub positions: u64,
    /// Seconds in the target model.
    pub model_seconds: f64,
    /// Seconds scheduling.
    pub schedule_seconds: f64,
    /// Seconds in the draft model.
    pub draft_seconds: f64,
    /// Steps that computed prompt chunks.
    pub prefill_steps: u64,
    /// Prompt positions they computed.
    pub prefill_positions: u64,
    /// Decode-shaped steps with nothing drafted, their positions and seconds.
    pub decode: (u64, u64, f64),
    /// Verification steps, their positions and seconds.
    pub verify: (u64, u64, f64),
}

impl StepTotals {
    /// The integer figures, in [`INTS`]' order.
    fn ints(&self) -> [u64; 8] {
        [
            self.steps,
            self.positions,
            self.prefill_steps,
            self.prefill_positions,
            self.decode.0,
            self.decode.1,
            self.verify.0,
            self.verify.1,
        ]
    }

    /// The seconds, in [`SECS`]' order.
    fn secs(&self) -> [f64; 5] {
        [
            self.model_seconds,
            self.schedule_seconds,
            self.draft_seconds,
            self.decode.2,
            self.verify.2,
        ]
    }
}

impl From<&modelfleet_engine::sched::Stats> for StepTotals {
    fn from(s: &modelfleet_engine::sched::Stats) -> Self {
        Self {
            steps: s.steps,
            positions: s.step_tokens,
            model_seconds: s.model_seconds,
            schedule_seconds: s.schedule_seconds,
            draft_seconds: s.draft_seconds,
            prefill_steps: s.prefill_steps,
            prefill_positions: s.prefill_positions,
            decode: (s.decode_steps, s.decode_positions, s.decode_seconds),
            verify: (s.verify_steps, s.verify_positions, s.verify_seconds),
        }
    }
}

fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric names");
    c
}

impl StepMetrics {
    /// Registers the counters in `registry`, labelled with the served model name, and the step token
    /// budget's gauge.
    pub fn new(registry: &Registry, model: &str, token_budget: usize) -> Self {
        let budget = register(
            registry,
            prometheus::IntGaugeVec::new(
                Opts::new(
                    "modelfleet_engine_step_token_budget",
                    "Positions one model step may compute (--max-num-batched-tokens)",
                ),
                &["model"],
            )
            .expect("valid metric"),
        );
        budget
            .with_label_values(&[model])
            .set(i64::try_from(token_budget).unwrap_or(i64::MAX));
        let m = Self {
            model: model.to_owned(),
            ints: INTS
                .iter()
                .map(|(name, help)| {
                    let c = IntCounterVec::new(Opts::new(*name, *help), &["model"]).expect("valid metric");
                    register(registry, c)
                })
                .collect(),
            secs: SECS
                .iter()
                .map(|(name, help)| {
                    let c = CounterVec::new(Opts::new(*name, *help), &["model"]).expect("valid metric");
                    register(registry, c)
                })
                .collect(),
        };
        m.refresh(&StepTotals::default()); // every series exists from start-up
        m
    }

    /// Raises the counters to the step loop's totals.
    pub fn refresh(&self, t: &StepTotals) {
        let l = [self.model.as_str()];
        for (c, v) in self.ints.iter().zip(t.ints()) {
            let c = c.with_label_values(&l);
            c.inc_by(v.saturating_sub(c.get()));
        }
        for (c, v) in self.secs.iter().zip(t.secs()) {
            let c = c.with_label_values(&l);
            let up = v - c.get();
            if up > 0.0 && up.is_finite() {
                c.inc_by(up);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(r: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn counters_follow_the_totals_and_never_go_down() {
        let r = Registry::new();
        let m = StepMetrics::new(&r, "tiny", 512);
        assert!(scrape(&r).contains("modelfleet_engine_steps_total{model=\"tiny\"} 0"));
        let t = StepTotals {
            steps: 10,
            positions: 170,
            model_seconds: 1.5,
            schedule_seconds: 0.25,
            draft_seconds: 0.0,
            prefill_steps: 2,
            prefill_positions: 160,
            decode: (6, 6, 0.5),
            verify: (2, 10, 0.25),
        };
        m.refresh(&t);
        m.refresh(&StepTotals {
            steps: 3,
            model_seconds: 0.5,
            ..t
        }); // an older copy: ignored
        let text = scrape(&r);
        for line in [
            "modelfleet_engine_steps_total{model=\"tiny\"} 10",
            "modelfleet_engine_step_positions_total{model=\"tiny\"} 170",
            "modelfleet_engine_model_seconds_total{model=\"tiny\"} 1.5",
            "modelfleet_engine_schedule_seconds_total{model=\"tiny\"} 0.25",
            "modelfleet_engine_draft_seconds_total{model=\"tiny\"} 0",
            "modelfleet_engine_prefill_steps_total{model=\"tiny\"} 2",
            "modelfleet_engine_prefill_positions_total{model=\"tiny\"} 160",
            "modelfleet_engine_decode_steps_total{model=\"tiny\"} 6",
            "modelfleet_engine_decode_positions_total{model=\"tiny\"} 6",
            "modelfleet_engine_decode_seconds_total{model=\"tiny\"} 0.5",
            "modelfleet_engine_verify_steps_total{model=\"tiny\"} 2",
            "modelfleet_engine_verify_positions_total{model=\"tiny\"} 10",
            "modelfleet_engine_verify_seconds_total{model=\"tiny\"} 0.25",
            "modelfleet_engine_step_token_budget{model=\"tiny\"} 512",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
    }
}
