#!/usr/bin/env python3
"""The tables of bench/spec_formats.sh, from its JSON lines (one run each).

    bench/spec_formats_summary.py RAW.jsonl

1. Throughput per (format, workload, streams): off and n-gram tok/s, median (min–max) over the reps;
   the ratio n-gram ÷ off of each rep (both runs of a rep are back to back, in ABBA order over the reps)
   listed, and its median (min–max); acceptance (accepted ÷ verified draft tokens); the step-cost
   gate's decisions (draft tokens it kept of those on offer); whether every rep's greedy answers were
   identical with speculation on and off.
2. What the steps cost, from the servers' own counters: a plain decode step (the off runs' decode
   steps: every sequence scoring one token) and a verification step (the n-gram runs' steps in which
   some sequence scored drafts) in milliseconds, the positions such a step scores, the verification
   step's cost in plain steps, the tokens a step of the n-gram run yields (generated tokens ÷ all its
   steps, the prompt's included) and the share of its steps that verified drafts.
"""
import json
import statistics
import sys


def med_range(xs, fmt="{:.2f}", unit=""):
    """The median, then the min–max in parentheses."""
    if not xs:
        return "—"
    return f"{fmt.format(statistics.median(xs))}{unit} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def per(run, num, den):
    """run[num] ÷ run[den], or None when the denominator is 0."""
    return run.get(num, 0) / run[den] if run.get(den) else None


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r["format"], r["workload"], r["streams"]), {}).setdefault(r["config"], {})[r["rep"]] = r
    order = {"f16": 0, "q8_0": 1, "q4_1": 2, "q4_k_m": 3}
    keys = sorted(groups, key=lambda k: (order.get(k[0], 9), k[0], k[1], k[2]))

    print("| format | workload | streams | off tok/s | n-gram tok/s | × off per rep | × off, median (min–max) "
          "| acceptance | gate kept / on offer | same text on and off |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in keys:
        off, on = groups[key].get("off", {}), groups[key].get("ngram", {})
        reps = sorted(set(off) & set(on))
        ratios = [on[r]["tok_s"] / off[r]["tok_s"] for r in reps]
        drafted = sum(r.get("spec_draft_tokens", 0) for r in on.values())
        accepted = sum(r.get("spec_accepted_tokens", 0) for r in on.values())
        offered = sum(r.get("spec_proposed_tokens", 0) for r in on.values())
        kept = sum(r.get("spec_gate_kept_tokens", 0) for r in on.values())
        acc = f"{accepted / drafted:.0%} of {drafted:.0f}" if drafted else "nothing drafted"
        gate = f"{kept:.0f} / {offered:.0f}" if offered else "nothing on offer"
        same = [r["same_text_as_other"] for g in (off, on) for r in g.values() if "same_text_as_other" in r]
        same_txt = ("yes" if all(same) else f"NO ({same.count(False)} of {len(same)})") if same else "—"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {med_range([r['tok_s'] for r in off.values()], '{:.1f}')} "
              f"| {med_range([r['tok_s'] for r in on.values()], '{:.1f}')} "
              f"| {', '.join(f'{x:.2f}' for x in ratios)} | **{med_range(ratios, unit='×')}** "
              f"| {acc} | {gate} | {same_txt} |")

    print()
    print("| format | workload | streams | plain step, ms | verification step, ms | positions a verification "
          "step | verification ÷ plain step | tokens a step with n-gram | verification steps ÷ all steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in keys:
        off, on = groups[key].get("off", {}).values(), groups[key].get("ngram", {}).values()
        plain = [x * 1e3 for x in (per(r, "decode_seconds", "decode_steps") for r in off) if x]
        verify = [x * 1e3 for x in (per(r, "verify_seconds", "verify_steps") for r in on) if x]
        width = [x for x in (per(r, "verify_positions", "verify_steps") for r in on) if x]
        share = [x for x in (per(r, "verify_steps", "steps") for r in on) if x is not None]
        tokens = [x for x in (per(r, "tokens", "steps") for r in on) if x]
        ratio = (f"{statistics.median(verify) / statistics.median(plain):.2f}" if plain and verify else "—")
        print(f"| {key[0]} | {key[1]} | {key[2]} | {med_range(plain)} | {med_range(verify)} "
              f"| {med_range(width, '{:.1f}')} | {ratio} | {med_range(tokens)} | {med_range(share)} |")


if __name__ == "__main__":
    main(sys.argv[1])
