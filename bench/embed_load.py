#!/usr/bin/env python3
"""A threaded load client for `POST /v1/embeddings`: N client threads, each with its own keep-alive
connection, send one input of exactly L tokens per request (special tokens included) for S seconds and
count the embeddings answered. Prints one JSON line: embeddings per second and latency percentiles.
Threads, not asyncio: with 2 cores, one asyncio loop measured llama-server's latencies at twice what a
threaded client saw (issue #50), so both servers are driven the same simple way.

    bench/embed_load.py --url http://127.0.0.1:18700 --model m --clients 16 --tokens 256 --seconds 10 \\
        --tokenizer MODEL_DIR/tokenizer.json
    bench/embed_load.py --summarize RAW.jsonl      # the Markdown table of runs side by side
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def words(tokenizer_json):
    """Lower-case alphabetic whole-word vocabulary entries: each is one WordPiece token."""
    vocab = json.load(open(tokenizer_json))["model"]["vocab"]
    return sorted(t for t in vocab if t.isascii() and t.isalpha() and t.islower() and len(t) >= 3)


def text(ws, n, seed):
    r = random.Random(seed)
    return " ".join(r.choice(ws) for _ in range(n))


def run(a):
    ws = words(a.tokenizer)
    u = urllib.parse.urlparse(a.url)
    deadline = time.monotonic() + a.seconds
    lat, errors, checked = [], [], []
    lock = threading.Lock()

    def client(c):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        i = 0
        while time.monotonic() < deadline:
            body = json.dumps({"model": a.model, "input": text(ws, a.tokens - 2, c * 1_000_003 + i),
                               "encoding_format": "float"})
            t0 = time.monotonic()
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            dt = time.monotonic() - t0
            with lock:
                if r.status != 200:
                    errors.append(f"{r.status} {data[:200]!r}")
                else:
                    lat.append(dt)
                    if not checked:
                        checked.append(json.loads(data).get("usage", {}).get("prompt_tokens"))
            i += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None
    print(json.dumps({
        "clients": a.clients, "tokens": a.tokens, "embeddings": len(lat), "errors": len(errors),
        "first_error": errors[0] if errors else None, "prompt_tokens_seen": checked[0] if checked else None,
        "seconds": round(wall, 3), "per_second": round(len(lat) / wall, 2),
        "p50_ms": round(pct(0.5) * 1000, 1) if lat else None, "p99_ms": round(pct(0.99) * 1000, 1) if lat else None,
    }))


def summarize(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    key = lambda r: (r["tokens"], r["clients"])
    out = {}
    for r in rows:
        out.setdefault(key(r), {}).setdefault(r["run"], {})[r["server"]] = r
    print("| input tokens | clients | ours emb/s (runs) | llama-server emb/s (runs) | ours ÷ llama-server per run | median |")
    print("|---|---|---|---|---|---|")
    for (tokens, clients), runs in sorted(out.items()):
        o = [runs[k]["ours"]["per_second"] for k in sorted(runs) if "ours" in runs[k] and "llama" in runs[k]]
        l = [runs[k]["llama"]["per_second"] for k in sorted(runs) if "ours" in runs[k] and "llama" in runs[k]]
        ratios = [x / y for x, y in zip(o, l) if y]
        fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
        print(f"| {tokens} | {clients} | {fmt(o)} | {fmt(l)} | {', '.join(f'{r:.2f}' for r in ratios)} | "
              f"{statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--model", default="m")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--tokenizer")
    p.add_argument("--summarize")
    a = p.parse_args()
    if a.summarize:
        summarize(a.summarize)
    else:
        run(a)
        sys.exit(0)
