#!/usr/bin/env python3
"""The tables of bench/spec_decode.sh, from its JSON lines (one run each).

    bench/spec_summary.py RAW.jsonl

1. Throughput: per (workload, streams, server, config), the median tok/s with its min–max, and the
   median of the per-rep ratios to the plain runs of the same reps ("× off"; the A/A control's second
   half against its first), with the acceptance rate from the speculation counters.
2. Where the time went (our server): the step loop's work per generated token — positions computed
   per token, model seconds (target and draft) per token and that figure's ratio to off (inverted, so
   it reads like the tok/s ratio) — and the share of the wall time spent in the models.
3. The work bound: a model step costs a + b·n for n positions (a: reading the weights, b: the
   arithmetic per position, both ≥ 0), so when nearly all of a run's wall time is in the model (table
   2's last column), off's time ÷ a configuration's lies between off's steps ÷ its steps and off's
   positions ÷ its positions, whatever a and b are on the machine at that moment. Those two ratios
   are counted, not timed: the machine's speed swings (±10–15% between runs of a few seconds here)
   do not reach them. The bound leaves out what is not linear in positions: attention's cost grows
   with the context, the same for both sides, and the n-gram lookup runs outside the model. A draft
   model's passes are time outside the target's steps, so configurations that ran one get no bound.
"""
import json
import statistics
import sys


def med_range(xs, fmt="{:.2f}", unit=""):
    """The median, then the min–max in parentheses."""
    return f"{fmt.format(statistics.median(xs))}{unit} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r["workload"], r["streams"], r["server"], r["config"]), []).append(r)

    def base_of(key):
        w, n, server, config = key
        if config in ("off", "control-a"):
            return None
        return groups.get((w, n, server, "control-a" if config == "control-b" else "off"))

    def paired(rs, base, f):
        """f(base run, run) for the runs whose rep has a base run."""
        by_rep = {b["rep"]: b for b in base}
        return [f(by_rep[r["rep"]], r) for r in rs if r["rep"] in by_rep]

    print("| workload | streams | server | config | tok/s median (min–max) | × off (median of per-rep ratios, min–max) | acceptance |")
    print("|---|---|---|---|---|---|---|")
    for key, rs in sorted(groups.items()):
        w, n, server, config = key
        base = base_of(key)
        ratio = ""
        if base:
            rr = paired(rs, base, lambda b, r: r["tok_s"] / b["tok_s"])
            ratio = med_range(rr, unit="×") if rr else ""
        acc = ""
        if "draft_tokens" in rs[0]:
            d = sum(r["draft_tokens"] for r in rs)
            a = sum(r["accepted"] for r in rs)
            k = sum(r["drafts"] for r in rs)
            acc = f"{a / d:.0%} of {d} drafted, {a / max(k, 1):.2f} per run" if d else "nothing drafted"
        tok = [r["tok_s"] for r in rs]
        print(f"| {w} | {n} | {server} | {config} | {med_range(tok, '{:.1f}')} | {ratio} | {acc} |")

    def model_s(r):
        return (r["model_s"] + r["draft_s"]) / r["tokens"]

    timed = {k: [r for r in rs if "model_s" in r and r["tokens"]] for k, rs in groups.items()}
    print()
    print("| workload | streams | config | positions ÷ token | model ms ÷ token, median (min–max) | × off in model time (min–max) | in the models ÷ wall |")
    print("|---|---|---|---|---|---|---|")
    for key, rs in sorted(timed.items()):
        if not rs:
            continue
        w, n, _, config = key
        base = [r for r in (base_of(key) or []) if "model_s" in r and r["tokens"]]
        ratio = ""
        if base:
            ratio = med_range(paired(rs, base, lambda b, r: model_s(b) / model_s(r)), unit="×")
        pos = statistics.median(r["positions"] / r["tokens"] for r in rs)
        busy = statistics.median((r["model_s"] + r["draft_s"]) / r["wall_s"] for r in rs)
        print(f"| {w} | {n} | {config} | {pos:.2f} | {med_range([1000 * model_s(r) for r in rs])} | {ratio} | {busy:.0%} |")

    print()
    print("| workload | streams | config | steps × off, median (min–max) | positions × off | work bound: lower end, median (min) | upper end, median (max) |")
    print("|---|---|---|---|---|---|---|")
    for key, rs in sorted(timed.items()):
        base = [r for r in (base_of(key) or []) if "steps" in r and r["tokens"]]
        if not rs or not base or any(r["draft_s"] > 0 for r in rs):
            continue  # a draft model's passes are time outside the target's steps: no bound
        w, n, _, config = key
        # Per generated token, so runs of different lengths (an EOS) compare.
        steps = paired(rs, base, lambda b, r: (b["steps"] / b["tokens"]) / (r["steps"] / r["tokens"]))
        pos = paired(rs, base, lambda b, r: (b["positions"] / b["tokens"]) / (r["positions"] / r["tokens"]))
        lo = [min(s, p) for s, p in zip(steps, pos)]
        hi = [max(s, p) for s, p in zip(steps, pos)]
        print(f"| {w} | {n} | {config} | {med_range(steps, '{:.3f}')} | {med_range(pos, '{:.3f}')} | "
              f"{statistics.median(lo):.3f}× ({min(lo):.3f}) | {statistics.median(hi):.3f}× ({max(hi):.3f}) |")


if __name__ == "__main__":
    main(sys.argv[1])
