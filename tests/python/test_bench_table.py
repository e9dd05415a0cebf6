"""tools/bench_table.py: the README numbers table regenerated from `indexshare bench --json` files.

Two small benches (the kernel-level stages and the KPool stage) write their JSON; the script's table
must name the machine the JSON records and carry each stage's numbers as the JSON has them (its own
reading is checked against the JSON here, not against a copy of its output). A file that is not a
bench JSON exits 2 naming it."""
import json
import os
import subprocess
import sys

from cli_run import run

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "bench_table.py")


def table(*paths):
    return subprocess.run([sys.executable, SCRIPT, *map(str, paths)], capture_output=True, text=True)


def test_table_from_bench_json(tmp_path):
    stages, kpool = tmp_path / "stages.json", tmp_path / "kpool.json"
    run("bench", "--problem", "sq16 skv256 hq4 dqk64 dv32 ih4 id32 k16", "--repeats", "1", "--seconds", "0.1",
        "--stack-seq", "0", "--model", "none", "--json", stages, expect=0)
    run("bench", "--kpool", "sq=30 skv=30 h=4 d=16 pool=4 k=16 hq=2 dqk=64 dv=32 nl=8 sched=FS", "--repeats", "1",
        "--json", kpool, expect=0)
    r = table(stages, kpool)
    assert r.returncode == 0, r.stderr
    d, k = json.loads(stages.read_text()), json.loads(kpool.read_text())
    m = d["machine"]
    assert m["cores"] >= 1 and m["simd_target"] and m["cpu"]
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"Machine: {m['cpu']} (") and f"Highway target {m['simd_target']}" in first
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    simd = [s for s in d["stages"] if s["impl"] == "simd"]
    # one row per simd stage, the commands and the backward, and the KPool stage
    assert len(rows) == len(simd) + 2 + 1
    logits = next(s for s in simd if s["stage"] == "indexer logits")
    row = next(line for line in rows if line.startswith("| indexer logits ("))
    assert f"{logits['gflops']:.0f} GFLOP/s" in row and f"{logits['speedup_vs_ref']:.0f}x ref" in row
    assert f"golden / run {d['commands']['golden_over_run']:.2f}x" in r.stdout
    assert f"golden / run {k['golden_over_run']:.2f}x" in rows[-1] and k["kpool"] in rows[-1]


def test_not_a_bench_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"stages": []}')
    r = table(bad)
    assert r.returncode == 2 and "bad.json" in r.stderr
    r = table(tmp_path / "missing.json")
    assert r.returncode == 2 and "missing.json" in r.stderr
