#!/usr/bin/env bash
# Multi-LoRA on the SmolLM2-135M shape (random f16 weights, GGUF, from gen-model) with four random
# rank-16 adapters on all seven target modules (gen-adapter):
#  (a) throughput of 16 streams spread over the 4 adapters vs the same 16 streams on the base model,
#      in process (runtime/server/examples/lora_bench.rs; median ratio of alternating runs);
#  (b) hot-load latency over HTTP: `serve` running, then POST /v1/adapters (fetch from file://, digest
#      verification, compatibility check, load) until the first completion naming the adapter
#      returns (max_tokens 1); each of the 4 adapters once, median and max.
#
#   bench/lora.sh            # THREADS=2
#
# Shares $MODELFLEET_BENCH_MODELS (default ~/.cache/modelfleet/bench-models) with the other benches.
# Run it on an idle machine; the figures are ratios and latencies, with the run's date.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}"
BIN="$TARGET/release/modelfleet-runtime"

cargo build --release --quiet -p modelfleet-runtime --bin modelfleet-runtime --example lora_bench
mkdir -p "$MODELS"
BASE="$MODELS/smollm2-135m-f16"
[[ -f "$BASE/model.gguf" ]] || "$BIN" gen-model "$BASE" --shape smollm2-135m --seed 1 --dtype f16 --format gguf
for i in 0 1 2 3; do
  [[ -d "$MODELS/lora-r16-$i" ]] || "$BIN" gen-adapter "$MODELS/lora-r16-$i" --base "$BASE" --rank 16 --seed $((i + 1))
done
echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs; threads $THREADS"
echo
echo "## (a) 16 streams, mixed over 4 adapters vs base"
"$TARGET/release/examples/lora_bench" "$BASE" "$MODELS"/lora-r16-{0,1,2,3} --streams 16 --gen 64 \
  --runs 5 --threads "$THREADS"

echo
echo "## (b) hot-load latency (POST /v1/adapters → first completion)"
WORK="$(mktemp -d)"
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
echo "bench-admin-token" >"$WORK/admin"
PORT=18431 ADMIN_PORT=18432
"$BIN" serve --model "$BASE" --served-model-name base --threads "$THREADS" --port $PORT \
  --admin-port $ADMIN_PORT --admin-token-file "$WORK/admin" --adapter-file-roots "$MODELS" \
  --adapter-dir "$WORK/store" --max-loras 4 --max-cpu-loras 4 >/dev/null 2>"$WORK/serve.log" &
PID=$!
python3 - "$PORT" "$ADMIN_PORT" "$BIN" "$MODELS" <<'PY'
import json, statistics, subprocess, sys, time, urllib.request
port, admin_port, binary, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def call(url, body=None, token=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.loads(r.read() or b"null")

t0 = time.time()
while True:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200:
            break
    except Exception:
        pass
    if time.time() - t0 > 120:
        sys.exit("serve did not become ready")
    time.sleep(0.1)
lat = []
for i in range(4):
    path = f"{models}/lora-r16-{i}"
    digest = subprocess.check_output([binary, "digest", path], text=True).strip()
    t = time.perf_counter()
    status, _ = call(f"http://127.0.0.1:{admin_port}/v1/adapters",
                     {"name": f"hot-{i}", "uri": f"file://{path}", "digest": digest}, "bench-admin-token")
    t_loaded = time.perf_counter()
    status2, out = call(f"http://127.0.0.1:{port}/v1/completions",
                        {"model": f"hot-{i}", "prompt": "Hello", "max_tokens": 1, "temperature": 0})
    t_served = time.perf_counter()
    assert status == 201 and status2 == 200, (status, status2, out)
    lat.append((t_loaded - t, t_served - t))
    print(f"| hot-{i} | POST {1000 * (t_loaded - t):.0f} ms | to first completion {1000 * (t_served - t):.0f} ms |")
print(f"\nmedian to first completion: {1000 * statistics.median(l[1] for l in lat):.0f} ms, "
      f"max {1000 * max(l[1] for l in lat):.0f} ms (adapter files: 19 MB f32, rank 16, 7 targets × 30 layers)")
PY
