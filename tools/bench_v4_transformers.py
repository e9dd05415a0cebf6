#!/usr/bin/env python3
"""DeepSeek-V4 attention on the CPU: `indexshare run --impl simd` against transformers' own
deepseek_v4 modules at the same shape, time and peak memory, each in its own process.

    .venv/bin/python tools/bench_v4_transformers.py [--tokens 1024] [--types CCCC] [--sched FSSS]

Shapes are V4-Flash's attention (64 heads of 512, window 128, top-512 over 4:1 blocks, indexer 64 x
128, HCA 128; projections at hidden 4096, q / o LoRA rank 1024, 8 output groups). transformers runs
one DeepseekV4Attention per layer (random weights, float32, eager attention, torch.no_grad), fed
random hidden states; its time is split into the whole module and the part our kernel-level stack
computes (the compressor with its indexer, and the attention itself; the projections and norms
excluded). indexshare computes the same layer types and C4A schedule on generated kernel inputs
(`run` on a V4 descriptor: inputs, then compressor, indexer, top-k, sparse attention and inverse
RoPE per layer). Peak memory: indexshare's whole process (inputs and outputs included); for
transformers the forward's peak above the RSS before it (its weights and inputs left out).
transformers' Shared C4A layers still run their own indexer (it has no index sharing on V4), so
the schedule only changes indexshare's work.
"""
import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = {"S": "sliding_attention", "C": "compressed_sparse_attention", "H": "heavily_compressed_attention"}


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field + " not in /proc/self/status")


def hf_child(tokens, types):
    """Runs in a child process: transformers' modules, prints one JSON line."""
    import torch
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

    n = len(types)
    cfg = DeepseekV4Config(
        vocab_size=32, hidden_size=4096, num_hidden_layers=n, num_attention_heads=64, head_dim=512, q_lora_rank=1024,
        partial_rotary_factor=64 / 512, sliding_window=128, o_groups=8, o_lora_rank=1024, index_n_heads=64,
        index_head_dim=128, index_topk=512, layer_types=[NAMES[t] for t in types],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        max_position_embeddings=max(65536, tokens), n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, mlp_layer_types=["moe"] * n)
    cfg._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(0)
    layers = []
    for i in range(n):
        a = M.DeepseekV4Attention(cfg, i).float().eval()
        with torch.no_grad():
            for name, p in a.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0 * p)
        layers.append(a)
    hidden = torch.randn(1, tokens, cfg.hidden_size, generator=gen)
    pos = torch.arange(tokens).unsqueeze(0)
    rot = M.DeepseekV4RotaryEmbedding(cfg)
    pe = {k: rot(hidden, position_ids=pos, layer_type=k) for k in ("main", "compress")}
    t = torch.arange(tokens)
    visible = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - cfg.sliding_window)
    mask = torch.zeros(1, 1, tokens, tokens).masked_fill(~visible, float("-inf"))
    core = [0.0]
    original = M.eager_attention_forward

    def timed_attention(*args, **kw):
        t0 = time.perf_counter()
        r = original(*args, **kw)
        core[0] += time.perf_counter() - t0
        return r

    starts = {}
    for a in layers:
        if a.compressor is not None:
            a.compressor.register_forward_pre_hook(lambda m, _i: starts.__setitem__(id(m), time.perf_counter()))
            a.compressor.register_forward_hook(
                lambda m, _i, _o: core.__setitem__(0, core[0] + time.perf_counter() - starts[id(m)]))
    with open("/proc/self/clear_refs", "w") as f:  # resets the peak RSS (VmHWM) to the present RSS
        f.write("5")
    before = status_kb("VmRSS")
    M.eager_attention_forward = timed_attention
    t0 = time.perf_counter()
    with torch.no_grad():
        for a in layers:
            a(hidden, pe, pos, mask)
    total = time.perf_counter() - t0
    M.eager_attention_forward = original
    peak = status_kb("VmHWM")
    print(json.dumps({"module_s": total, "core_s": core[0], "peak_kb": peak, "before_forward_kb": before,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


def ours(binary, tokens, types, sched):
    spec = (f"t={tokens} h=64 d=512 w=128 csa=4 hca=128 ih=64 id=128 k=512 rope=64 ctx=65536 types={types}"
            + (f" sched={sched}" if sched else ""))
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); "
            "print('peak_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, binary, "run", "--impl", "simd", "--problem", spec],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit("indexshare run failed:\n" + r.stdout + r.stderr)
    m = re.search(r"time\s+inputs ([0-9.]+) s, stack ([0-9.]+) s", r.stdout)
    return {"inputs_s": float(m.group(1)), "stack_s": float(m.group(2)), "wall_s": wall,
            "peak_kb": int(re.search(r"peak_kb (\d+)", r.stdout).group(1)), "spec": spec}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--types", default="CCCC", help="one of S / C / H per layer")
    ap.add_argument("--sched", default="FSSS", help="the C4A layers' F/S pattern for indexshare ('' : all Full)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "indexshare"))
    ap.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hf_child:
        return hf_child(a.tokens, a.types)
    mine = ours(a.binary, a.tokens, a.types, a.sched)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--hf-child", "--tokens", str(a.tokens), "--types", a.types],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("transformers run failed:\n" + r.stderr[-4000:])
    hf = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"machine      {cpu_name()}, {os.cpu_count()} CPUs (torch {hf['torch']}, {hf['threads']} threads)")
    print(f"shape        {mine['spec']}")
    print(f"indexshare   stack {mine['stack_s']:.2f} s (inputs {mine['inputs_s']:.2f} s), peak RSS {mine['peak_kb'] / 2**20:.2f} GiB")
    extra = hf["peak_kb"] - hf["before_forward_kb"]
    print(f"transformers attention modules {hf['module_s']:.2f} s, of which compressor + indexer + attention "
          f"{hf['core_s']:.2f} s; peak RSS during the forward {hf['peak_kb'] / 2**20:.2f} GiB, "
          f"{extra / 2**20:.2f} GiB above its weights and inputs")
    print(f"ratio        time: transformers' core / indexshare's stack {hf['core_s'] / mine['stack_s']:.2f}x; "
          f"memory: indexshare's whole peak / transformers' forward alone {mine['peak_kb'] / max(1, extra):.2f}")


if __name__ == "__main__":
    main()
