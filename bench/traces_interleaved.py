#!/usr/bin/env python3
"""Two runtimes of one model, tracing off and on (every request sampled and exported), both up at once
and loaded in turns: pair i sends one burst of STREAMS simultaneous streamed requests to one side, then
the same burst to the other (the order alternating with i), so a slow spell of a shared machine lands on
both sides of a pair instead of on one whole run. Prints one JSON line per pair (each side's tok/s, TTFT
p50 and mean, ITL p50, and — given the servers' pids — the CPU seconds the server spent on the burst;
the on/off ratios), then a summary line: the pooled ratios (all tokens over all wall time per side; the
mean of every TTFT sample per side; all CPU over all tokens per side) and the median and range of the
per-pair ratios. CPU per token is the steadiest of these on a shared machine: the same work costs the
same CPU whether a slow spell stretches its wall time or not.

    bench/traces_interleaved.py --off http://127.0.0.1:18740 --on http://127.0.0.1:18742 --model m \
        --pairs 20 --streams 16 --max-tokens 64 [--off-pid P --on-pid Q]
"""

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import time

spec = importlib.util.spec_from_file_location("loadgen", os.path.join(os.path.dirname(__file__), "loadgen.py"))
loadgen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loadgen)


def cpu_seconds(pid):
    """A process's user + system CPU seconds so far (0 without a pid)."""
    if not pid:
        return 0.0
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def burst(url, model, streams, max_tokens, pid=None):
    """One burst: `streams` clients, one streamed chat request each, at once."""
    results = []
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(
        loadgen.client(url, model, " ".join(f"word{(i * 7 + j) % 50}" for j in range(24)) + f" stream {i}",
                       max_tokens, 1, results, {"chat": True})
        for i in range(streams)))
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    ttft = [s[0] - t for t, s, _ in results if s]
    itl = [b - a for _, s, _ in results for a, b in zip(s, s[1:])]
    tokens = sum(n for _, _, n in results)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "ttft": ttft,
            "ttft_p50_ms": loadgen.pct(ttft, 0.5) * 1e3, "ttft_mean_ms": statistics.mean(ttft) * 1e3,
            "itl_p50_ms": loadgen.pct(itl, 0.5) * 1e3, "cpu_s": cpu}


def spread(values):
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--off", required=True)
    ap.add_argument("--on", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--off-pid", type=int)
    ap.add_argument("--on-pid", type=int)
    args = ap.parse_args()
    sides = {"off": args.off, "on": args.on}
    pids = {"off": args.off_pid, "on": args.on_pid}
    runs = {k: [] for k in sides}
    ratios = {"tok_s": [], "ttft_p50": [], "ttft_mean": [], "cpu_per_token": []}
    for i in range(args.pairs):
        order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        pair = {}
        for side in order:
            pair[side] = await burst(sides[side], args.model, args.streams, args.max_tokens, pids[side])
            runs[side].append(pair[side])
        ratios["tok_s"].append(pair["on"]["tok_s"] / pair["off"]["tok_s"])
        ratios["ttft_p50"].append(pair["on"]["ttft_p50_ms"] / pair["off"]["ttft_p50_ms"])
        ratios["ttft_mean"].append(pair["on"]["ttft_mean_ms"] / pair["off"]["ttft_mean_ms"])
        if pair["off"]["cpu_s"] > 0:
            per_token = {s: pair[s]["cpu_s"] / pair[s]["tokens"] for s in sides}
            ratios["cpu_per_token"].append(per_token["on"] / per_token["off"])
        print(json.dumps({"pair": i, **{s: {k: round(v, 2) for k, v in pair[s].items() if k != "ttft"}
                                        for s in sides},
                          "tok_s_ratio": round(ratios["tok_s"][-1], 4),
                          "ttft_p50_ratio": round(ratios["ttft_p50"][-1], 4)}), flush=True)
    pooled = {s: sum(r["tokens"] for r in runs[s]) / sum(r["wall_s"] for r in runs[s]) for s in sides}
    ttft_all = {s: statistics.mean(t for r in runs[s] for t in r["ttft"]) for s in sides}
    cpu = {s: sum(r["cpu_s"] for r in runs[s]) / sum(r["tokens"] for r in runs[s]) for s in sides}
    print(json.dumps({
        "summary": True, "pairs": args.pairs, "streams": args.streams,
        "tok_s": {s: round(v, 1) for s, v in pooled.items()},
        "tok_s_ratio_pooled": round(pooled["on"] / pooled["off"], 4),
        "ttft_mean_ms": {s: round(v * 1e3, 1) for s, v in ttft_all.items()},
        "ttft_ratio_pooled": round(ttft_all["on"] / ttft_all["off"], 4),
        "tok_s_ratio_pairs": spread(ratios["tok_s"]),
        "ttft_p50_ratio_pairs": spread(ratios["ttft_p50"]),
        "ttft_mean_ratio_pairs": spread(ratios["ttft_mean"]),
        **({"cpu_ms_per_token": {s: round(v * 1e3, 3) for s, v in cpu.items()},
            "cpu_ratio_pooled": round(cpu["on"] / cpu["off"], 4),
            "cpu_ratio_pairs": spread(ratios["cpu_per_token"])} if cpu["off"] > 0 else {}),
    }), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
