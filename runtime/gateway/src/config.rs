//! `modelfleet-gateway run` flags. Every flag has an env twin `MODELFLEET_GATEWAY_<FLAG_IN_CAPS>`
//! (docs/design.md, "Gateway"); `docs/operations.md` lists them with their defaults.

use crate::limits::FailureMode;
use clap::{Parser, ValueEnum};
use std::time::Duration;

/// How a deployment's pod is chosen for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Routing {
    /// Consistent hashing with bounded loads on the affinity key (the default).
    Affinity,
    /// Each request to the next pod in turn (no affinity; for comparison and debugging).
    RoundRobin,
}

/// `modelfleet-gateway run`.
#[derive(Parser, Clone, Debug)]
pub struct RunArgs {
    /// Address to bind (default: `$POD_IP`, else 127.0.0.1).
    #[arg(long, env = "MODELFLEET_GATEWAY_HOST")]
    pub host: Option<String>,
    /// Port of the OpenAI API (and `/health`, `/ready`).
    #[arg(long, env = "MODELFLEET_GATEWAY_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Port of `/metrics` (and `/health`, `/ready`); tenants need not reach it.
    #[arg(long, env = "MODELFLEET_GATEWAY_METRICS_PORT", default_value_t = 8081)]
    pub metrics_port: u16,
    /// Namespaces whose ModelDeployments this gateway serves (default: all).
    #[arg(long, env = "MODELFLEET_GATEWAY_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Bounded-load factor c: a pod is passed over when its load + 1 exceeds ⌈c × (total load + 1) / pods⌉.
    #[arg(long, env = "MODELFLEET_GATEWAY_LOAD_FACTOR", default_value_t = 1.25, value_parser = parse_load_factor)]
    pub load_factor: f64,
    /// A pod whose load + 1 is at most this keeps its keys whatever the bound says (a batching replica
    /// serves a few requests at once for little more than one; moving one loses its cached prefix).
    /// 0: the plain CHWBL bound.
    #[arg(long, env = "MODELFLEET_GATEWAY_LOAD_FLOOR", default_value_t = 4.0, value_parser = parse_load_floor)]
    pub load_floor: f64,
    /// Requests held per deployment while it has no Ready pod (beyond: 429 with Retry-After).
    #[arg(
        long,
        env = "MODELFLEET_GATEWAY_MAX_PENDING_PER_DEPLOYMENT",
        default_value_t = 256
    )]
    pub max_pending_per_deployment: usize,
    /// Seconds a request is held while its deployment has no Ready pod (then 504).
    #[arg(long, env = "MODELFLEET_GATEWAY_MAX_PENDING_WAIT", default_value_t = 180.0)]
    pub max_pending_wait: f64,
    /// Attempts on other pods after a failure before the first byte (connect error, reset, 503,
    /// 429 `queue_full`, an adapter's 404).
    #[arg(long, env = "MODELFLEET_GATEWAY_RETRIES", default_value_t = 2)]
    pub retries: u32,
    /// Add `x-modelfleet-pod: <pod>` to responses (`--pod-header false` to leave it out).
    #[arg(long, env = "MODELFLEET_GATEWAY_POD_HEADER", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub pod_header: bool,
    /// How a pod is chosen.
    #[arg(long, env = "MODELFLEET_GATEWAY_ROUTING", value_enum, default_value_t = Routing::Affinity)]
    pub routing: Routing,
    /// Characters of the rendered prompt that go into the affinity key.
    #[arg(long, env = "MODELFLEET_GATEWAY_AFFINITY_PREFIX_CHARS", default_value_t = 512)]
    pub affinity_prefix_chars: usize,
    /// Port of the runtime pods' `/metrics` (their admin port: no token there).
    #[arg(long, env = "MODELFLEET_GATEWAY_POD_METRICS_PORT", default_value_t = 8001)]
    pub pod_metrics_port: u16,
    /// Port of the runtime pods' OpenAI API.
    #[arg(long, env = "MODELFLEET_GATEWAY_POD_PORT", default_value_t = 8000)]
    pub pod_port: u16,
    /// Milliseconds between scrapes of each pod's load.
    #[arg(long, env = "MODELFLEET_GATEWAY_SCRAPE_INTERVAL_MS", default_value_t = 1000)]
    pub scrape_interval_ms: u64,
    /// Seconds between reads of each referenced tenants Secret (key rotation takes effect within this).
    #[arg(
        long,
        env = "MODELFLEET_GATEWAY_SECRET_REFRESH_SECONDS",
        default_value_t = 3.0
    )]
    pub secret_refresh_seconds: f64,
    /// The store tenant limits and budgets live in, shared by every gateway replica: `redis://host:port`
    /// (Redis or Valkey). Without it each replica counts on its own (right for one replica only).
    #[arg(long, env = "MODELFLEET_GATEWAY_LIMITS_STORE")]
    pub limits_store: Option<String>,
    /// Milliseconds a call to the limits store may take before it counts as unreachable.
    #[arg(
        long,
        env = "MODELFLEET_GATEWAY_LIMITS_STORE_TIMEOUT_MS",
        default_value_t = 250
    )]
    pub limits_store_timeout_ms: u64,
    /// When the limits store cannot be reached: `open` admits requests without fleet-wide limits,
    /// `closed` answers 503 `limits_unavailable`.
    #[arg(long, env = "MODELFLEET_GATEWAY_LIMITS_FAILURE_MODE", value_enum, default_value_t = FailureMode::Open)]
    pub limits_failure_mode: FailureMode,
    /// Largest request body, bytes.
    #[arg(long, env = "MODELFLEET_GATEWAY_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Connections served at once (one more is closed at once).
    #[arg(long, env = "MODELFLEET_GATEWAY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers.
    #[arg(long, env = "MODELFLEET_GATEWAY_HEADER_READ_TIMEOUT", default_value_t = 10.0)]
    pub header_read_timeout: f64,
    /// Seconds a client's keep-alive connection with nothing in flight stays open (longer than
    /// clients' pool idle timeouts, so clients close idle connections first).
    #[arg(long, env = "MODELFLEET_GATEWAY_IDLE_TIMEOUT", default_value_t = 120.0)]
    pub idle_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, env = "MODELFLEET_GATEWAY_BODY_READ_TIMEOUT", default_value_t = 30.0)]
    pub body_read_timeout: f64,
    /// Seconds from arrival until a request that has not started streaming is answered 504 (a body's
    /// `timeout` may shorten it).
    #[arg(long, env = "MODELFLEET_GATEWAY_REQUEST_TIMEOUT", default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Seconds of silence from a pod mid-response before the response is ended with an error.
    #[arg(
        long,
        env = "MODELFLEET_GATEWAY_UPSTREAM_IDLE_TIMEOUT",
        default_value_t = 120.0
    )]
    pub upstream_idle_timeout: f64,
    /// Seconds `/ready` answers 503 after SIGTERM while requests are still served (endpoints drop the
    /// gateway first), before the listener closes.
    #[arg(long, env = "MODELFLEET_GATEWAY_DRAIN_SECONDS", default_value_t = 5.0)]
    pub drain_seconds: f64,
    /// Seconds requests in flight get to finish after the listener closed.
    #[arg(
        long,
        env = "MODELFLEET_GATEWAY_SHUTDOWN_GRACE_SECONDS",
        default_value_t = 60.0
    )]
    pub shutdown_grace_seconds: f64,
    /// Logs and traces (docs/operations.md, "Traces").
    #[command(flatten)]
    pub telemetry: modelfleet_telemetry::TelemetryArgs,
}

fn parse_load_factor(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v >= 1.0 {
        Ok(v)
    } else {
        Err(format!("must be a number >= 1, got {s}"))
    }
}

fn parse_load_floor(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a number >= 0, got {s}"))
    }
}

/// Seconds → a `Duration` (negative and non-finite values become zero).
pub fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, String> {
        let mut argv = vec!["gw"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map(|c| c.run)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            (a.port, a.retries, a.load_factor, a.load_floor),
            (8080, 2, 1.25, 4.0)
        );
        assert!(a.pod_header && a.namespaces.is_empty());
        let a = parse(&[
            "--namespaces",
            "a,b",
            "--pod-header",
            "false",
            "--load-factor",
            "2",
        ])
        .unwrap();
        assert_eq!(a.namespaces, ["a", "b"]);
        assert!(!a.pod_header);
        assert!(parse(&["--pod-header"]).unwrap().pod_header);
        let e = parse(&["--load-factor", "0.5"]).unwrap_err();
        assert!(e.contains("must be a number >= 1"), "{e}");
    }
}
