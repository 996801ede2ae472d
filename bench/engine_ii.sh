#!/usr/bin/env bash
# Engine II in process: the step loop driven through EngineHandle (no HTTP) on the SmolLM2-135M shape
# (random weights from gen-model, GGUF) in f16 and q8_0, with runtime/engine/examples/serve_bench.rs:
# (a) aggregate tokens/s and inter-token latency at 1/4/16/64 streams, (b) TTFT of a 1,000-token
# system prompt with a cold vs a warm prefix cache, (c) the scheduler's share of step time with 256
# sequences running, (d) peak KV slots allocated but empty for 64 mixed-length sequences.
#
#   bench/engine_ii.sh                       # THREADS=2; prints one Markdown table per model
#   bench/engine_ii.sh --streams 1,16        # extra arguments go to serve_bench
#
# Peer figures (from the issue): llama.cpp llama-server -np 16 on SmolLM2 f16, 2 threads: ≈100 tok/s
# at 1 stream, ≈315 aggregate at 16. About 4–5 minutes per model on 2 cores.
#
# Shares the models of bench/engine_vs_llamacpp.sh under $MODELFLEET_BENCH_MODELS (default
# ~/.cache/modelfleet/bench-models). Before each model it waits (up to IDLE_WAIT_S, default 300 s) for
# the machine to be idle (< 5% of a core busy for 2 s), then reports how much CPU other processes used
# during the run: figures taken while that is large are noisy.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" IDLE_WAIT_S="${IDLE_WAIT_S:-300}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}"

cargo build --release --quiet -p modelfleet-engine --example serve_bench
mkdir -p "$MODELS"
for dt in f16 q8_0; do
  if [[ ! -f "$MODELS/smollm2-135m-$dt/model.gguf" ]]; then
    # Only built when a model is missing (the same models as bench/engine_vs_llamacpp.sh).
    cargo build --release --quiet -p modelfleet-runtime --bin modelfleet-runtime
    "$TARGET/release/modelfleet-runtime" gen-model "$MODELS/smollm2-135m-$dt" --shape smollm2-135m \
      --seed 1 --dtype "$dt" --format gguf
  fi
done

exec python3 - "$TARGET/release/examples/serve_bench" "$THREADS" "$IDLE_WAIT_S" \
  "$MODELS/smollm2-135m-f16/model.gguf" "$MODELS/smollm2-135m-q8_0/model.gguf" -- "$@" <<'PY'
import os, resource, subprocess, sys, time
bench, threads, idle_wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
sep = sys.argv.index("--")
models, extra = sys.argv[4:sep], sys.argv[sep + 1:]
HZ = os.sysconf("SC_CLK_TCK")

def busy_jiffies():
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return sum(v) - v[3] - v[4]  # minus idle and iowait

def wait_idle():
    t0 = time.time()
    while time.time() - t0 < idle_wait:
        b0 = busy_jiffies()
        time.sleep(2)
        if (busy_jiffies() - b0) / HZ < 0.1:
            return True
    return False

print(f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs; {bench}")
for path in models:
    idle = wait_idle()
    b0, r0, t0 = busy_jiffies(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    out = subprocess.run([bench, path, "--threads", threads, *extra], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    b1, r1, wall = busy_jiffies(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time() - t0
    mine = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    others = max(0.0, (b1 - b0) / HZ - mine)
    print(out.rstrip())
    note = "" if idle else f" (the machine was not idle after {idle_wait:.0f} s of waiting)"
    print(f"Other processes used {others:.1f} CPU-s during this {wall:.0f} s run"
          f" ({others / wall:.0%} of a core on average){note}; "
          + ("figures are noisy." if others > max(0.05 * wall, 0.15) else "quiet run."))
PY
