#!/usr/bin/env python3
"""A streaming load generator for OpenAI-compatible servers (ours and llama.cpp's llama-server).

N concurrent clients each send REQS requests one after another to /v1/completions with `stream: true`,
greedy sampling and EOS ignored, so every request generates exactly MAX_TOKENS tokens. Reports, as one
JSON line: aggregate generated tokens/s over the run, TTFT p50/p99 and inter-token latency p50/p99
(gaps between streamed chunks that carry text), and the decode rate after the first token summed over the
requests (`decode_tok_s`). `--prompt-tokens N` sends N token ids as each prompt (exact lengths on both
servers, different per stream).

    bench/loadgen.py --url http://127.0.0.1:8000 --model NAME --streams 16 --requests 2 --max-tokens 128

Plain asyncio sockets and HTTP/1.1 (no client library), so the client costs the same for both servers.

For workloads with real prompts (bench/spec_decode.sh): `--prompts FILE` (a JSON list of strings; stream
i sends prompt i modulo the list), `--chat` (POST /v1/chat/completions with the prompt as one user
message), `--eos` (do not ignore EOS: requests end where the model ends them) and `--no-stream` (one JSON
answer per request; tokens are counted from each answer's `usage.completion_tokens`, which both servers
report, so tokens/s is exact even when lengths differ; `--save-texts FILE` then writes each answer's
text, by stream and request, so two configurations' greedy outputs can be compared). `--temperature T
--seed S` samples instead of greedy decoding, request i of stream s seeded with S + 1000 s + i (a
seeded request's text is reproducible, with or without n-gram speculation).
"""

import argparse
import asyncio
import json
import statistics
import time
from urllib.parse import urlparse


async def one_request(host, port, model, prompt, max_tokens, opts=None):
    opts = opts or {}
    req = {"model": model, "max_tokens": max_tokens, "temperature": opts.get("temperature", 0),
           "stream": not opts.get("no_stream")}
    if opts.get("seed") is not None:
        req["seed"] = opts["seed"]
    if not opts.get("eos"):
        req["ignore_eos"] = True
    if opts.get("chat"):
        req["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        req["prompt"] = prompt
        path = "/v1/completions"
    body = json.dumps(req).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    t0 = time.perf_counter()
    status = await reader.readline()
    if b" 200 " not in status:
        rest = await reader.read()
        raise RuntimeError(f"{status!r} {rest[:300]!r}")
    if opts.get("no_stream"):
        raw = await reader.read()
        answer = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        writer.close()
        choice = answer["choices"][0]
        text = choice.get("text") or (choice.get("message") or {}).get("content")
        return t0, [time.perf_counter()], answer["usage"]["completion_tokens"], text
    stamps, chunks = [], 0
    buf = b""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                ev = json.loads(payload)
            except ValueError:
                continue
            for c in ev.get("choices") or []:
                text = c.get("text") or (c.get("delta") or {}).get("content")
                if text:
                    stamps.append(time.perf_counter())
                    chunks += 1
    writer.close()
    return t0, stamps, max_tokens, None


async def client(url, model, prompt, max_tokens, requests, out, opts=None, texts=None, stream=0):
    u = urlparse(url)
    for i in range(requests):
        if opts and opts.get("seed") is not None:
            # A seed of its own for each request, the same in every run.
            opts = {**opts, "seed": opts["base_seed"] + 1000 * stream + i}
        t0, stamps, n, text = await one_request(u.hostname, u.port, model, prompt, max_tokens, opts)
        out.append((t0, stamps, n))
        if texts is not None:
            texts.append({"stream": stream, "request": i, "text": text})


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(path):
    """Prints the Markdown table of a run's JSON lines (ours vs llama-server per model and streams)."""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    by = {(r["model"], r["server"], r["streams"]): r for r in rows}
    print("| model | streams | ours tok/s | llama-server tok/s | ratio | TTFT p50/p99 ms (ours / llama) "
          "| ITL p50/p99 ms (ours / llama) |")
    print("|---|---|---|---|---|---|---|")
    for (model, server, n), r in sorted(by.items()):
        l = by.get((model, "llama", n))
        if server != "ours" or not l:
            continue
        print(f"| {model} | {n} | {r['tok_s']} | {l['tok_s']} | {r['tok_s'] / l['tok_s']:.2f}x "
              f"| {r['ttft_p50_ms']}/{r['ttft_p99_ms']} / {l['ttft_p50_ms']}/{l['ttft_p99_ms']} "
              f"| {r['itl_p50_ms']}/{r['itl_p99_ms']} / {l['itl_p50_ms']}/{l['itl_p99_ms']} |")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2, help="requests per stream")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int,
                    help="send N token ids as the prompt (the same length on every server; distinct per stream)")
    ap.add_argument("--prompt-offset", type=int, default=0,
                    help="with --prompt-tokens: another set of prompts (no prefix shared with other offsets)")
    ap.add_argument("--prompts", help="JSON list of prompts; stream i sends prompt i mod len")
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    ap.add_argument("--eos", action="store_true", help="do not ignore EOS")
    ap.add_argument("--no-stream", action="store_true", help="count tokens from usage")
    ap.add_argument("--save-texts", help="with --no-stream: write each answer's text here (JSON)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--seed", type=int, help="seed request i of stream s with SEED + 1000 s + i")
    args = ap.parse_args()
    opts = {"chat": args.chat, "eos": args.eos, "no_stream": args.no_stream,
            "temperature": args.temperature, "seed": args.seed, "base_seed": args.seed}
    prompts = json.load(open(args.prompts)) if args.prompts else None

    def prompt(i):
        if prompts:
            return prompts[i % len(prompts)]
        if args.prompt_tokens:
            # Ordinary ids of any vocabulary above 30k, different for each stream (no shared prefix).
            k = i + 1000 * args.prompt_offset
            return [1000 + (k * 7919 + j * 104729) % 29000 for j in range(args.prompt_tokens)]
        return " ".join(f"word{(i * 7 + j) % 50}" for j in range(args.prompt_words)) + f" stream {i}"

    results, texts = [], [] if args.save_texts else None
    t0 = time.perf_counter()
    await asyncio.gather(*(
        client(args.url, args.model, prompt(i), args.max_tokens, args.requests, results, opts, texts, i)
        for i in range(args.streams)))
    wall = time.perf_counter() - t0
    if texts is not None:
        texts.sort(key=lambda t: (t["stream"], t["request"]))
        json.dump(texts, open(args.save_texts, "w"))
    ttft = [s[0] - t for t, s, _ in results if s and not args.no_stream]
    # Each request's decode rate after its first token, summed over the requests (they run side by side):
    # the decode throughput without the prefill, which long prompts would otherwise dominate.
    decode = sum((len(s) - 1) / (s[-1] - s[0]) for _, s, _ in results if len(s) > 1 and s[-1] > s[0])
    itl = [b - a for _, s, _ in results for a, b in zip(s, s[1:])]
    chunks = sum(len(s) for _, s, _ in results)
    tokens = sum(n for _, _, n in results)
    print(json.dumps({
        "streams": args.streams, "requests": len(results), "max_tokens": args.max_tokens,
        "tokens": tokens, "chunks": chunks, "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 1), "decode_tok_s": round(decode, 1),
        "ttft_p50_ms": round(pct(ttft, 0.5) * 1e3, 1), "ttft_p99_ms": round(pct(ttft, 0.99) * 1e3, 1),
        "itl_p50_ms": round(pct(itl, 0.5) * 1e3, 2), "itl_p99_ms": round(pct(itl, 0.99) * 1e3, 2),
    }))


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        summarize(sys.argv[2])
    else:
        asyncio.run(main())
