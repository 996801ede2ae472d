//! Where the step loop's time goes, per `model`: `modelfleet_engine_steps_total` (model steps run),
//! `modelfleet_engine_step_positions_total` (positions the steps computed: prompt tokens, decoded
//! tokens and speculative verification positions alike), `modelfleet_engine_model_seconds_total`
//! (in the target model's forward pass and sampling), `modelfleet_engine_schedule_seconds_total`
//! (scheduling and building batches) and `modelfleet_engine_draft_seconds_total` (in a draft model's
//! passes; 0 without one).
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

/// The step-loop counters of one server.
pub struct StepMetrics {
    model: String,
    steps: IntCounterVec,
    positions: IntCounterVec,
    model_seconds: CounterVec,
    schedule_seconds: CounterVec,
    draft_seconds: CounterVec,
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
}

impl From<&modelfleet_engine::sched::Stats> for StepTotals {
    fn from(s: &modelfleet_engine::sched::Stats) -> Self {
        Self {
            steps: s.steps,
            positions: s.step_tokens,
            model_seconds: s.model_seconds,
            schedule_seconds: s.schedule_seconds,
            draft_seconds: s.draft_seconds,
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
    /// Registers the counters in `registry`, labelled with the served model name.
    pub fn new(registry: &Registry, model: &str) -> Self {
        let int = |name: &str, help: &str| {
            register(
                registry,
                IntCounterVec::new(Opts::new(name, help), &["model"]).expect("valid metric"),
            )
        };
        let secs = |name: &str, help: &str| {
            register(
                registry,
                CounterVec::new(Opts::new(name, help), &["model"]).expect("valid metric"),
            )
        };
        let m = Self {
            model: model.to_owned(),
            steps: int(
                "modelfleet_engine_steps_total",
                "Model steps run by the step loop",
            ),
            positions: int(
                "modelfleet_engine_step_positions_total",
                "Positions computed by model steps (prompt, decoded and verification positions)",
            ),
            model_seconds: secs(
                "modelfleet_engine_model_seconds_total",
                "Seconds in the target model's forward passes and sampling",
            ),
            schedule_seconds: secs(
                "modelfleet_engine_schedule_seconds_total",
                "Seconds scheduling and building batches",
            ),
            draft_seconds: secs(
                "modelfleet_engine_draft_seconds_total",
                "Seconds in a draft model's passes",
            ),
        };
        m.refresh(&StepTotals::default()); // every series exists from start-up
        m
    }

    /// Raises the counters to the step loop's totals.
    pub fn refresh(&self, t: &StepTotals) {
        let l = [self.model.as_str()];
        for (c, v) in [(&self.steps, t.steps), (&self.positions, t.positions)] {
            let c = c.with_label_values(&l);
            c.inc_by(v.saturating_sub(c.get()));
        }
        for (c, v) in [
            (&self.model_seconds, t.model_seconds),
            (&self.schedule_seconds, t.schedule_seconds),
            (&self.draft_seconds, t.draft_seconds),
        ] {
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
        let m = StepMetrics::new(&r, "tiny");
        assert!(scrape(&r).contains("modelfleet_engine_steps_total{model=\"tiny\"} 0"));
        let t = StepTotals {
            steps: 10,
            positions: 170,
            model_seconds: 1.5,
            schedule_seconds: 0.25,
            draft_seconds: 0.0,
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
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
    }
}
