#!/usr/bin/env python3
"""Two servers of one model, speculation off and on, both up at once and asked in turns: request i goes
to one then the other (the order alternating with i), one at a time, so a slow spell of a shared machine
lands on both sides instead of on one whole run. Prints one JSON line per side (loadgen's fields:
tokens, wall_s — the time spent on that side's requests —, tok_s) and writes each side's answers.

    bench/spec_interleaved.py --off http://127.0.0.1:18740 --on http://127.0.0.1:18742 --model m \
        --prompts stories.json --chat --max-tokens 256 --temperature 1 --seed 1 --requests 8 \
        --save-texts-off A.json --save-texts-on B.json

Request i sends prompt i modulo the list, seeded with SEED + i on both sides (a seeded request's text
is the same with and without n-gram speculation).
"""

import argparse
import asyncio
import importlib.util
import json
import os
import time
from urllib.parse import urlparse

spec = importlib.util.spec_from_file_location("loadgen", os.path.join(os.path.dirname(__file__), "loadgen.py"))
loadgen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loadgen)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--off", required=True)
    ap.add_argument("--on", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save-texts-off", required=True)
    ap.add_argument("--save-texts-on", required=True)
    args = ap.parse_args()
    prompts = json.load(open(args.prompts))
    sides = {"off": args.off, "on": args.on}
    spent = {k: 0.0 for k in sides}
    tokens = {k: 0 for k in sides}
    texts = {k: [] for k in sides}
    for i in range(args.requests):
        order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        for side in order:
            u = urlparse(sides[side])
            opts = {"chat": args.chat, "no_stream": True, "temperature": args.temperature,
                    "seed": args.seed + i}
            t0 = time.perf_counter()
            _, _, n, text = await loadgen.one_request(
                u.hostname, u.port, args.model, prompts[i % len(prompts)], args.max_tokens, opts)
            spent[side] += time.perf_counter() - t0
            tokens[side] += n
            texts[side].append({"stream": 0, "request": i, "text": text})
    json.dump(texts["off"], open(args.save_texts_off, "w"))
    json.dump(texts["on"], open(args.save_texts_on, "w"))
    for side in ("off", "on"):
        print(json.dumps({"side": side, "streams": 1, "requests": args.requests, "max_tokens": args.max_tokens,
                          "tokens": tokens[side], "wall_s": round(spent[side], 3),
                          "tok_s": round(tokens[side] / spent[side], 1)}))


if __name__ == "__main__":
    asyncio.run(main())
