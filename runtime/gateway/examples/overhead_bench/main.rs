//! The gateway's own cost per request (issue #15's overhead figure): a trivial OpenAI-shaped upstream
//! (a test pod answering a fixed chat completion at once, on its own loopback IP) and the real gateway
//! in front of it — its router, its bounded listener, its flags' defaults (affinity routing, pod
//! header, per-request log line), one deployment with that pod, one tenant key — then the closed-loop
//! load generator of `loadgen.rs`, straight at the upstream and through the gateway, alternating, for
//! `--pairs` pairs at each `--clients` level. Added latency = gateway − direct, pair by pair.
//!
//! Upstream, gateway and clients each run on their own tokio runtime (`--workers` threads each), as
//! three processes would; on this machine all share two cores, so at 64 clients the figures include
//! queueing for the CPU. The gateway logs each request as the binary does (`info`, one line), to
//! `--log-file` (default /dev/null). Commands and figures: docs/benchmarks.md ("Gateway overhead").
//!
//!   cargo run --release -p modelfleet-gateway --example overhead_bench -- --pairs 5 --clients 1,64

#[path = "../../tests/common/mod.rs"]
mod common;
mod loadgen;

use bytes::Bytes;
use clap::Parser;
use common::{COMPLETION, COMPLETION_CHUNKS, Mode, deployment};
use modelfleet_api::listener::{Limits, serve};
use modelfleet_api::tenants::Tenants;
use modelfleet_crds::{FallbackSpec, FallbackTarget, FallbackTrigger};
use modelfleet_gateway::config::{RunArgs, secs};
use modelfleet_gateway::fleet::{DeploymentId, Fleet, Pod, Tenancy};
use modelfleet_gateway::routes;
use modelfleet_gateway::state::{Gateway, Settings};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "Gateway overhead against a trivial upstream")]
struct Args {
    /// Direct/gateway pairs per client level.
    #[arg(long, default_value_t = 5)]
    pairs: usize,
    /// Concurrent clients, one level after another.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Warm-up seconds per phase (not measured).
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Ask for an SSE stream (4 events) instead of one JSON body.
    #[arg(long)]
    stream: bool,
    /// An open deployment (no key) instead of one with a tenant key.
    #[arg(long)]
    open: bool,
    /// Worker threads of each runtime (upstream, gateway, clients).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where the gateway's request log goes (`none`: no log subscriber at all).
    #[arg(long, default_value = "/dev/null")]
    log_file: String,
    /// Export the gateway's spans (every request traced) to this OTLP/HTTP collector; the request log
    /// lines then go nowhere (compare with `--log-file none`).
    #[arg(long)]
    traces: Option<String>,
    /// Every request is moved by `spec.fallback`: the deployment asked for has no pod and falls back
    /// at once (`noReadyReplicaWaitSeconds: 0`) to one with the upstream (compare with a run without:
    /// the difference is the fallback decision's cost).
    #[arg(long)]
    fallback: bool,
}

/// The gateway's fleet: deployment `chat` (`llama`) with `pod`; with `fallback`, `chat` has no pod and
/// falls back to `small` (`smol`), which has it.
fn bench_fleet(pod: &Pod, tenancy: Tenancy, fallback: bool) -> Fleet {
    if !fallback {
        return Fleet::new(vec![deployment(std::slice::from_ref(pod), tenancy, &[])], true);
    }
    let mut primary = deployment(&[], tenancy.clone(), &[]);
    primary.fallback = Some(Arc::new(FallbackSpec {
        no_ready_replica_wait_seconds: 0,
        first_token_deadline_milliseconds: None,
        targets: vec![FallbackTarget {
            model_deployment: Some("small".into()),
            provider: None,
            triggers: vec![FallbackTrigger::NoReadyReplica],
        }],
    }));
    let mut small = deployment(std::slice::from_ref(pod), tenancy, &[]);
    small.id = DeploymentId {
        namespace: "ns".into(),
        name: "small".into(),
    };
    small.served_name = "smol".into();
    Fleet::new(vec![primary, small], true)
}

/// The gateway's flags at their defaults (their env twins apply), as `modelfleet-gateway run` sees them.
#[derive(Parser)]
struct GatewayCli {
    #[command(flatten)]
    run: RunArgs,
}

const KEY: &str = "sk-bench-tenant";

fn runtime(name: &str, workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn install_log(path: &str) {
    if path == "none" {
        return;
    }
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap_or_else(|e| panic!("--log-file {path}: {e}"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::sync::Mutex::new(file))
        .try_init();
}

/// The median and range of `v`, formatted with `digits` decimals.
fn spread(v: &[f64], digits: usize) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let median = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    format!(
        "{median:.digits$} ({:.digits$}–{:.digits$})",
        s[0],
        s[s.len() - 1]
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let telemetry = args.traces.as_ref().map(|endpoint| {
        // SAFETY: set before any other thread of this process starts.
        unsafe { std::env::set_var("RUST_LOG", "off") };
        modelfleet_telemetry::init(
            "modelfleet-gateway",
            &modelfleet_telemetry::TelemetryArgs {
                otlp_traces_endpoint: Some(endpoint.clone()),
                trace_sample_ratio: Some(1.0),
                trace_queue: 4096,
                ..Default::default()
            },
        )
    });
    if telemetry.is_none() {
        install_log(&args.log_file);
    }
    let up_rt = runtime("upstream", args.workers);
    let gw_rt = runtime("gateway", args.workers);
    let client_rt = runtime("clients", args.workers);

    // The upstream: one test pod on its own loopback IP, answering a fixed completion.
    let (pods, port) = up_rt.block_on(common::pods(1));
    pods[0].set(Mode::Completion);
    let pod = pods[0].pod();

    // The gateway: its default flags, the pod's port, one deployment with that pod.
    let mut gw_args = GatewayCli::parse_from(["modelfleet-gateway"]).run;
    gw_args.pod_port = port;
    let tenancy = if args.open {
        Tenancy::Open
    } else {
        let text = format!("tenants:\n- id: bench\n  apiKeys: [{KEY}]\n");
        Tenancy::Keys(Arc::new(Tenants::parse(&text).expect("a tenants file")))
    };
    let fleet = bench_fleet(&pod, tenancy, args.fallback);
    let (fleet_tx, gw_addr) = gw_rt.block_on(async {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(fleet));
        let gw = Gateway::new(
            rx,
            Settings::from_args(&gw_args),
            gw_args.max_pending_per_deployment,
            Duration::from_millis(gw_args.scrape_interval_ms.max(100)),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("an address");
        let limits = Limits {
            max_connections: gw_args.max_connections,
            header_read_timeout: secs(gw_args.header_read_timeout),
            idle_timeout: secs(gw_args.idle_timeout),
            ..Limits::default()
        };
        tokio::spawn(serve(listener, routes::api(gw), limits, std::future::pending()));
        (tx, addr)
    });

    let path = "/v1/chat/completions";
    let direct = format!("http://{}:{port}{path}", pod.ip);
    let through = format!("http://{gw_addr}{path}");
    let body = Bytes::from(
        serde_json::json!({
            "model": "llama",
            "stream": args.stream,
            "max_tokens": 16,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Say hello."}
            ]
        })
        .to_string(),
    );
    let expect = Bytes::from(if args.stream {
        COMPLETION_CHUNKS.concat()
    } else {
        COMPLETION.to_string()
    });
    // Both ways answer the same bytes before anything is measured.
    client_rt.block_on(async {
        let c = loadgen::client();
        for url in [&direct, &through] {
            let got = loadgen::once(&c, url, KEY, &body).await;
            assert_eq!(got.as_ref(), Some(&expect), "{url} answered otherwise");
        }
    });

    println!(
        "{} CPUs; load average {}; workers per runtime {}; {} body; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        args.workers,
        if args.stream { "SSE (4 events)" } else { "JSON" },
        if args.open {
            "open deployment"
        } else {
            "tenant key"
        },
    );
    println!(
        "Load: closed loop, tokio + reqwest (one keep-alive HTTP/1.1 connection per client), {}s measured after {}s warm-up per phase",
        args.seconds, args.warmup
    );
    let (warmup, measure) = (secs(args.warmup), secs(args.seconds));
    let mut failed = 0;
    for &clients in &args.clients {
        println!();
        println!(
            "## {clients} client(s), {} pairs (direct, gateway alternate which goes first)",
            args.pairs
        );
        println!(
            "| pair | direct p50 / p99 ms | gateway p50 / p99 ms | added p50 / p99 ms | direct req/s | gateway req/s | gateway ÷ direct req/s | gateway CPU µs/req | upstream CPU µs/req (direct / via gateway) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut cols: [Vec<f64>; 12] = Default::default();
        for pair in 0..args.pairs {
            // A phase and the CPU µs per answer its gateway and upstream threads spent.
            let run = |url: &str| {
                let (gw0, up0) = (loadgen::cpu_ns("gateway"), loadgen::cpu_ns("upstream"));
                let p = client_rt.block_on(loadgen::phase(
                    url,
                    KEY,
                    body.clone(),
                    expect.clone(),
                    clients,
                    warmup,
                    measure,
                ));
                let per = |ns: u64| ns as f64 / 1000.0 / p.all.max(1) as f64;
                let cpu = (
                    per(loadgen::cpu_ns("gateway") - gw0),
                    per(loadgen::cpu_ns("upstream") - up0),
                );
                (p, cpu)
            };
            let ((d, d_cpu), (g, g_cpu)) = if pair % 2 == 0 {
                let d = run(&direct);
                (d, run(&through))
            } else {
                let g = run(&through);
                (run(&direct), g)
            };
            failed += d.errors + g.errors;
            let row = [
                d.pct_ms(0.5),
                d.pct_ms(0.99),
                g.pct_ms(0.5),
                g.pct_ms(0.99),
                g.pct_ms(0.5) - d.pct_ms(0.5),
                g.pct_ms(0.99) - d.pct_ms(0.99),
                d.rps(),
                g.rps(),
                g.rps() / d.rps(),
                g_cpu.0,
                d_cpu.1,
                g_cpu.1,
            ];
            println!(
                "| {} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} / {:.0} |{}",
                pair + 1,
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                row[5],
                row[6],
                row[7],
                row[8],
                row[9],
                row[10],
                row[11],
                if d.errors + g.errors > 0 {
                    format!(" errors: direct {}, gateway {}", d.errors, g.errors)
                } else {
                    String::new()
                }
            );
            for (c, v) in cols.iter_mut().zip(row) {
                c.push(v);
            }
        }
        println!(
            "| median (range) | {} / {} | {} / {} | **{}** / **{}** | {} | {} | {} | {} | {} / {} |",
            spread(&cols[0], 3),
            spread(&cols[1], 3),
            spread(&cols[2], 3),
            spread(&cols[3], 3),
            spread(&cols[4], 3),
            spread(&cols[5], 3),
            spread(&cols[6], 0),
            spread(&cols[7], 0),
            spread(&cols[8], 2),
            spread(&cols[9], 0),
            spread(&cols[10], 0),
            spread(&cols[11], 0),
        );
    }
    println!();
    println!("load average at the end {}", loadavg());
    if let Some(t) = telemetry {
        t.shutdown(std::time::Duration::from_secs(3));
        let c = modelfleet_telemetry::counters();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "spans exported {}, dropped {}, failed batches {}",
            n(&c.exported),
            n(&c.dropped),
            n(&c.failed_batches)
        );
    }
    drop(fleet_tx);
    if failed > 0 {
        eprintln!("overhead_bench: {failed} requests failed");
        std::process::exit(1);
    }
}
