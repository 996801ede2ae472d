#!/usr/bin/env python3
"""The Markdown tables of bench/traces.sh from its JSON lines (one per measurement; stdin or a file).

First every round: tokens/s, TTFT p50 and the server's CPU seconds per mode, as median (range), and
each mode's ratio to `off` in the same round. Then only the pairs measured in the same machine state:
this machine (2 shared cores) switches between a fast and a slow state — inter-token latency p50 near
23 ms or near 30 ms at 16 streams, whatever the server does — for minutes at a time, which moves every
figure by 25 %; a pair whose two runs' ITL p50 differ by under 3 % ran in one state, and its ratio
measures the mode, not the machine.
"""

import json
import statistics
import sys

MODES = ["off", "on", "down", "hung"]


def med(xs):
    if not xs:
        return "–"
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}–{max(xs):.3g})"


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    rows = [json.loads(l) for l in src if l.startswith("{")]
    by = {(r["mode"], r["round"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows if r["round"] > 0})
    print("| mode | tok/s (16 streams) | ÷ off | TTFT p50 ms (16 streams) | ÷ off | TTFT p50 ms (1 client) | ÷ off "
          "| server CPU s | ÷ off | spans exported / dropped (last round) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        ks = [k for k in rounds if (mode, k) in by and ("off", k) in by]
        rs = [by[(mode, k)] for k in ks]
        ratio = lambda f: [f(by[(mode, k)]) / f(by[("off", k)]) for k in ks]
        last = rs[-1]
        spans = (f'{last.get("modelfleet_trace_spans_exported_total", 0):.0f} / '
                 f'{last.get("modelfleet_trace_spans_dropped_total", 0):.0f}')
        print(f"| {mode} | {med([r['tok_s'] for r in rs])} | {med(ratio(lambda r: r['tok_s']))} "
              f"| {med([r['ttft_p50_ms'] for r in rs])} | {med(ratio(lambda r: r['ttft_p50_ms']))} "
              f"| {med([r['ttft1_p50_ms'] for r in rs])} | {med(ratio(lambda r: r['ttft1_p50_ms']))} "
              f"| {med([r['cpu_ticks'] / 100 for r in rs])} | {med(ratio(lambda r: r['cpu_ticks']))} | {spans} |")
    print()
    print("Pairs in one machine state (the two runs' ITL p50 within 3 %):")
    print()
    print("| mode | pairs | tok/s ÷ off | TTFT p50 ÷ off (16 streams) | TTFT p50 ÷ off (1 client) | server CPU ÷ off |")
    print("|---|---|---|---|---|---|")
    for mode in MODES[1:]:
        ks = [k for k in rounds if (mode, k) in by and ("off", k) in by
              and abs(by[(mode, k)]["itl_p50_ms"] / by[("off", k)]["itl_p50_ms"] - 1) < 0.03]
        ratio = lambda f: [f(by[(mode, k)]) / f(by[("off", k)]) for k in ks]
        print(f"| {mode} | {len(ks)} of {len(rounds)} | {med(ratio(lambda r: r['tok_s']))} "
              f"| {med(ratio(lambda r: r['ttft_p50_ms']))} | {med(ratio(lambda r: r['ttft1_p50_ms']))} "
              f"| {med(ratio(lambda r: r['cpu_ticks']))} |")


if __name__ == "__main__":
    main()
