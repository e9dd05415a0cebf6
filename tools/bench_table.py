#!/usr/bin/env python3
"""The numbers table of simd/README.md, regenerated from `indexshare bench --json` files.

    indexshare bench --json run.json                 # the default problem (about a minute on 2 cores)
    indexshare bench --kpool "SPEC" --json kpool.json   # optional: the kind stages (--v4, --kpool)
    python3 tools/bench_table.py run.json [kpool.json ...] > table.md

Prints a Markdown paragraph naming the machine (CPU model, vector extensions, hardware threads and
the simd path's Highway target, from the JSON's `machine`) and one table: a row per simd stage
(GFLOP/s, share of the FMA peak, speedup over ref), the Full/Shared stack's measured over predicted
speedup, the commands' ratios, the attention backward's, and the --v4 / --kpool stages' goals.
Every number is read from the JSON files given: nothing is measured here. A file that is not a
bench JSON (no `machine`, or neither `stages` nor a kind stage) exits 2 naming it.
"""
from __future__ import annotations

import json
import sys


def pct(x):
    return f"{100 * x:.0f} %"


def machine_line(m: dict) -> str:
    isa = m.get("isa") or "no AVX2"
    return (f"Machine: {m.get('cpu', 'unknown')} ({isa}), {m.get('cores', '?')} hardware threads, "
            f"Highway target {m.get('simd_target', '?')}.")


def stage_rows(d: dict) -> list[list[str]]:
    rows = []
    for s in d.get("stages", []):
        if s["impl"] != "simd":
            continue
        res = []
        if s.get("gflops"):
            res.append(f"{s['gflops']:.0f} GFLOP/s, {pct(s['peak_share'])} of the FMA peak ({d['peak_gflops']['threads_n']['used']:.0f})")
        if s.get("keys_per_s"):
            res.append(f"{s['keys_per_s'] / 1e6:.0f} M keys/s")
        if s.get("speedup_vs_ref"):
            res.append(f"{s['speedup_vs_ref']:.0f}x ref")
        rows.append([f"{s['stage']} ({s['threads']} threads)", f"`{d['problem']}`", ", ".join(res) or f"{s['median_s']:.4f} s"])
    st = d.get("stack")
    if st:
        rows.append(["F S S S over all-Full", f"`{st['problem']}`",
                     f"{st['measured_speedup']:.2f}x against {st['predicted_speedup']:.2f}x predicted "
                     f"({pct(st['measured_over_predicted'])} of it)"])
    c = d.get("commands")
    if c:
        rows.append(["commands", f"`{c['problem']}`",
                     f"golden / run {c['golden_over_run']:.2f}x, diff / golden {c['diff_over_golden']:.2f}x, "
                     f"input generation / run {c['inputs_over_run']:.2f}x"])
    b = d.get("attention_backward")
    if b:
        rows.append(["attention backward", f"`{d['problem']}`",
                     f"{b['backward_over_forward']:.2f}x the forward's time, {b['speedup_over_ref']:.0f}x ref, "
                     f"peak RSS growth {b['memory_ratio']:.2f}x the forward's"])
    return rows


def kind_rows(d: dict) -> list[list[str]]:
    if "kpool" in d:
        parts = d["parts"]
        score = parts["score"]
        t = sorted(score["wall"])[len(score["wall"]) // 2]
        return [["GLM-5.3 KPool (`bench --kpool`)", f"`{d['kpool']}`",
                 f"scores {score['flops'] / t / 1e9:.0f} GFLOP/s = {pct(d['score_share'])} of the FMA peak "
                 f"({d['peak_gflops']:.0f}); golden / run {d['golden_over_run']:.2f}x"]]
    if "v4" in d:
        result = f"golden / run {d['golden_over_run']:.2f}x"
        if "ref_over_simd" in d:  # absent with --v4-ref no
            result += f", ref / simd {d['ref_over_simd']:.1f}x, ref = simd: {'yes' if d['ref_equals_simd'] else 'NO'}"
        return [["DeepSeek-V4 (`bench --v4`)", f"`{d['v4']}`", result]]
    return []


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[0] + "\nusage: bench_table.py BENCH.json [BENCH.json ...]", file=sys.stderr)
        return 2
    rows, machines = [], []
    for path in argv:
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            print(f"bench_table: {path}: {e}", file=sys.stderr)
            return 2
        if not isinstance(d, dict) or "machine" not in d or not ("stages" in d or "kpool" in d or "v4" in d):
            print(f"bench_table: {path}: not an `indexshare bench --json` file with a 'machine' field", file=sys.stderr)
            return 2
        line = machine_line(d["machine"])
        if line not in machines:
            machines.append(line)
        rows += stage_rows(d) + kind_rows(d)
    print(" ".join(machines) + " Medians over the bench's repeats; regenerate with tools/bench_table.py.\n")
    print("| what | problem | result |\n|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
