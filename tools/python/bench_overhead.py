#!/usr/bin/env python3
"""The Python call's overhead over the C++ kernel, on the bench problem (`indexshare bench`'s default).

    python tools/python/bench_overhead.py [--repeats 31] [--impl simd] [--problem DESC]

For each kernel (layer 0 of the problem's golden set as inputs, numpy and torch): the median wall time
of the Python call (the user's whole call: arguments in, the result back in the caller's framework, and
freeing it), the median time the C++ kernel itself ran (measured inside the binding with the GIL
released: indexshare._core.last_kernel_seconds, output allocation included) and the median overhead of
a call (call - kernel, paired) in microseconds and as a share of the kernel. The load average is printed
before and after: the machine's other work stretches both times. Run from the repository root after a
build (or with the package installed).

What the overhead is: the inputs reach the kernel without a copy (ref/tensor.h BorrowedTensor), so it
is argument checks, nanobind's conversions, wrapping the result and freeing it: a few microseconds with
warm caches, but a call runs right after its kernel has streamed megabytes through the core (or the
core has run other processes), so its Python and nanobind code runs cold, several times slower. topk
(a ~2 ms kernel here) therefore has a fast path (indexshare/kernels.py) that hands C-contiguous numpy
arrays / torch tensors straight to the binding's typed arguments and returns torch results by DLPack,
without the checks and numpy views in Python; see tools/python/README.md, "Numbers".
"""
import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
# OpenMP's workers sleep between calls (as under ctest) instead of spinning on the cores the next call's
# Python and copies run on: with 2 cores, spinning doubled the kernels' times here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if os.environ.get("INDEXSHARE_INSTALLED") != "1":
    sys.path.insert(0, str(ROOT / "tools" / "python"))
    os.environ.setdefault("INDEXSHARE_CORE_DIR", str(ROOT / "build" / "python" / "indexshare"))

import indexshare  # noqa: E402
from indexshare._core_loader import core  # noqa: E402

BENCH = "sq128 skv2048 hq16 dqk576 dv512 ih64 id128 k256 seed1"  # tools/cli/cmd_bench.cc kDefaultProblem


def measure(fn, repeats):
    """Medians of the call's time, the kernel's time and the overhead of each call (paired: the
    machine's noise moves both times of one call alike)."""
    calls, kernels, over = [], [], []
    fn()  # warm-up
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        call = time.perf_counter() - t0
        kern = core().last_kernel_seconds()
        calls.append(call)
        kernels.append(kern)
        over.append(call - kern)
        if os.environ.get("BENCH_VERBOSE"): print(f"  call {call * 1e3:.2f} ms kernel {kern * 1e3:.2f} ms")
    return statistics.median(calls), statistics.median(kernels), statistics.median(over)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--impl", default="simd")
    ap.add_argument("--problem", default=BENCH)
    a = ap.parse_args()
    g = indexshare.golden(a.problem, impl="simd", logits=False)
    t = g.tensors
    frameworks = {"numpy": t}
    try:
        import torch  # noqa: F401
        from indexshare import _arrays
        frameworks["torch"] = {n: _arrays.out(a_.copy(), True) for n, a_ in t.items()}
    except ImportError:
        pass
    cfg = g.config
    print(f"problem   {indexshare.Problem(a.problem)}  impl {a.impl}  threads {indexshare.get_num_threads()}  "
          f"target {core().simd_target()}  repeats {a.repeats} (medians)")
    print(f"load average {load()} (1, 5, 15 min) before")
    print(f"{'kernel':18} {'framework':9} {'call ms':>10} {'kernel ms':>10} {'overhead us':>12} {'overhead':>9}")
    for fw, x in frameworks.items():
        p = "layers.0."
        ix = [x[p + "indexer." + n] for n in ("q", "k", "k_scale", "weights", "ks", "ke")]
        logits = indexshare.indexer_logits(*ix, impl=a.impl)
        runs = {
            "indexer_logits": lambda: indexshare.indexer_logits(*ix, impl=a.impl),
            "topk": lambda: indexshare.topk(logits, ix[4], ix[5], cfg["topk"], impl=a.impl),
            "indexer_topk": lambda: indexshare.indexer_topk(*ix, cfg["topk"], impl=a.impl),
            "sparse_attention": lambda: indexshare.sparse_attention(x[p + "attn.q"], x[p + "attn.kv"], x[p + "attn.indices"],
                                                                    cfg["sm_scale"], cfg["d_v"], impl=a.impl),
            "dense_attention": lambda: indexshare.dense_attention(x[p + "attn.q"], x[p + "attn.kv"], cfg["sm_scale"],
                                                                  cfg["d_v"], ix[4], ix[5], impl=a.impl),
        }
        for name, fn in runs.items():
            call, kern, over = measure(fn, a.repeats)
            print(f"{name:18} {fw:9} {call * 1e3:10.3f} {kern * 1e3:10.3f} {over * 1e6:12.1f} {100 * over / kern:8.2f}%")
    print(f"load average {load()} after")


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
