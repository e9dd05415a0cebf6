#!/usr/bin/env python3
"""Interop and reproducibility test of the checked-in golden sets.

Usage: test_goldens.py PATH/TO/indexshare GOLDEN_ROOT

For every golden set under GOLDEN_ROOT:
  1. Load tensors.safetensors with the stock PyPI `safetensors` parser (safetensors.deserialize),
     map dtypes to NumPy (ml_dtypes for BF16 and F8_E4M3), and check that names, dtypes and shapes
     equal the manifest and that every tensor's SHA-256 matches.
  2. Recompute invariants independently in NumPy: indexer logits of a few rows from the FP8 codes
     (exact float64 dot products, the documented head-sum order), -inf outside [ks, ke), top-k
     structure (valid count, range, no duplicates, score order), Shared layers using their source
     Full layer's positions, out_bf16 == bf16(out), empty rows (out 0, lse +inf); kpool sets: the
     pooled keys (softmax over the P slots, float64), -inf scores past the visible pools, the pools'
     score order and count, each union list = the pools' tokens + the tail, Shared layers' lists.
  3. Regenerate the set from the manifest's replay line into a temporary folder and require the
     same SHA-256 for every tensor.
"""
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
from safetensors import deserialize

DTYPES = {"F64": np.float64, "F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
          "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn}


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    out = {}
    for name, info in deserialize(raw):
        data = bytes(info["data"])
        out[name] = (info["dtype"], list(info["shape"]), data,
                     np.frombuffer(data, dtype=DTYPES[info["dtype"]]).reshape(info["shape"]))
    return out


def check_hyv4(m, A):
    """A Hunyuan HY V4 set (tools/lib/golden_hyv4.h): bf16 copies, the top-k against the scores, the
    causal -inf, Shared layers' indices, the head weights' two scales and the gate, in NumPy."""
    errors = []
    cfg = m["config"]
    H, D = cfg["index_n_heads"], cfg["index_head_dim"]
    first = cfg["s_kv"] - cfg["s_q"]
    for layer in m["layers"]:
        p = f"layers.{layer['index']}."
        for a, b in (("attn.out", "attn.out_bf16"), ("attn.gated", "attn.gated_bf16")):
            if not np.array_equal(A(p + a).astype(ml_dtypes.bfloat16).view(np.uint16), A(p + b).view(np.uint16)):
                errors.append(f"{p}{b} != bf16({a})")
        sig = (1.0 / (1.0 + np.exp(-A(p + "attn.gate").astype(np.float64)))).astype(np.float32)
        if not np.allclose(A(p + "attn.o_v") * sig, A(p + "attn.gated"), rtol=3e-7, atol=0):
            errors.append(f"{p}attn.gated != attn.o_v * sigmoid(attn.gate)")
        src = f"layers.{layer['source']}."
        if not np.array_equal(A(src + "indexer.topk"), A(p + "attn.indices")[:, 0, :]):
            errors.append(f"{p}attn.indices are not the top-k of layer {layer['source']}")
        if layer["kind"] != "full":
            continue
        raw = A(p + "indexer.weights_raw")
        w = (raw * np.float32(1 / np.sqrt(H))).astype(np.float32) * np.float32(1 / np.sqrt(D))
        if not np.array_equal(w.astype(np.float32), A(p + "indexer.weights")):
            errors.append(f"{p}indexer.weights != (raw * f32(H^-1/2)) * f32(D^-1/2)")
        scores, topk = A(p + "indexer.scores"), A(p + "indexer.topk")
        for r in range(topk.shape[0]):
            n = first + r + 1
            if not np.all(np.isneginf(scores[r, n:])) or np.any(np.isneginf(scores[r, :n])):
                errors.append(f"{p}indexer.scores row {r}: not -inf exactly past its {n} causal keys")
            sel = [int(v) for v in topk[r] if v >= 0]
            want = sorted(range(n), key=lambda s_: (-scores[r, s_], s_))[: len(topk[r])]
            if sel != want or any(v != -1 for v in topk[r][len(sel):]):
                errors.append(f"{p}indexer.topk row {r}: {list(topk[r])} is not the score-descending, key-ascending top-k")
    return errors


def m_names(m):
    return {e["name"] for e in m["tensors"]}


def check_kpool(A, m, errors):
    """GLM-5.3 KPool-DSA sets (tools/lib/golden_kpool.h), recomputed here in float64."""
    cfg = m["config"]
    P, sq, skv, sel_k = cfg["pool"], cfg["s_q"], cfg["s_kv"], cfg["select_k"]
    n = skv // P
    for layer in m["layers"]:
        p = f"layers.{layer['index']}."
        ind = A(p + "attn.indices")[:, 0, :]
        if layer["kind"] == "shared":
            if not np.array_equal(ind, A(f"layers.{layer['source']}.indexer.indices")):
                errors.append(f"{p}attn.indices are not the list of source layer {layer['source']}")
            continue
        z = A(p + "indexer.pool_logits").astype(np.float64)
        kk = A(p + "indexer.k")[: n * P].astype(np.float64).reshape(n, P, -1)
        e = np.exp(z - z.max(axis=1, keepdims=True))
        kbar = (e / e.sum(axis=1, keepdims=True) * kk).sum(axis=1)
        if cfg["rounding"] == "f32" and not np.allclose(A(p + "indexer.pool_keys"), kbar, rtol=2.0**-22, atol=1e-37):
            errors.append(p + "indexer.pool_keys differ from the softmax-weighted pools by more than an f32 rounding")
        if p + "indexer.pool_keys_fp8" in m_names(m):
            # SGLang's pages: [64 x D e4m3][64 f32 scales]; dequantized within an e4m3 step of the
            # Hadamard-rotated bf16 keys (Sylvester matrix times D^-1/2, float64 here).
            D = kk.shape[2]
            pages = A(p + "indexer.pool_keys_fp8").reshape(-1, 64 * (D + 4))
            codes = pages[:, : 64 * D].reshape(-1, D)[:n].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
            scales = pages[:, 64 * D:].copy().view(np.float32).reshape(-1)[:n].astype(np.float64)
            H = np.array([[1.0]])
            while H.shape[0] < D:
                H = np.block([[H, H], [H, -H]])
            bf = A(p + "indexer.pool_keys").astype(ml_dtypes.bfloat16).astype(np.float64)
            rot = bf @ H.T / np.sqrt(D)
            if np.any(np.abs(codes * scales[:, None] - rot) > 2.0**-3 * np.abs(rot) + scales[:, None] * 2.0**-8):
                errors.append(p + "indexer.pool_keys_fp8: a dequantized value is not the rotated key within an e4m3 step")
        scores, pools, lst = A(p + "indexer.scores"), A(p + "indexer.pools"), A(p + "indexer.indices")
        for r in range(sq):
            pos = skv - sq + r
            ke = min((pos + 1) // P, n)
            if not np.all(np.isneginf(scores[r, ke:])) or not np.all(np.isfinite(scores[r, :ke])):
                errors.append(f"{p}indexer.scores row {r}: not -inf exactly past the {ke} visible pools")
            chosen = [int(v) for v in pools[r] if v >= 0]
            rest = [scores[r, q] for q in range(ke) if q not in chosen]
            if len(chosen) != min(sel_k, ke) or (rest and max(rest) > min(scores[r, chosen])):
                errors.append(f"{p}indexer.pools row {r}: not the {min(sel_k, ke)} best visible pools")
            tail = list(range(pos - (pos + 1) % P + 1, pos + 1)) if cfg["tail"] else []
            want = sorted([q * P + j for q in chosen for j in range(P)] + tail)
            if sorted(int(v) for v in lst[r] if v >= 0) != want or not np.array_equal(lst[r], ind[r]):
                errors.append(f"{p}indexer.indices row {r}: not the pools' tokens and the tail, or not attn.indices")


def check_set(cli, d):
    errors = []
    m = json.load(open(os.path.join(d, "manifest.json")))
    t = load(os.path.join(d, "tensors.safetensors"))
    listed = {e["name"]: e for e in m["tensors"]}
    if set(listed) != set(t):
        errors.append(f"names differ: only manifest {set(listed) - set(t)}, only file {set(t) - set(listed)}")
    for name, e in listed.items():
        if name not in t:
            continue
        dtype, shape, data, _ = t[name]
        if dtype != e["dtype"] or shape != e["shape"]:
            errors.append(f"{name}: {dtype}{shape} in the file, {e['dtype']}{e['shape']} in the manifest")
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            errors.append(f"{name}: sha256 mismatch")
    A = lambda n: t[n][3]
    cfg = m["config"]
    if m["kind"] == "hyv4":
        errors += check_hyv4(m, A)
    k = cfg.get("topk", 0)
    if m["kind"] == "kpool":
        check_kpool(A, m, errors)
    for layer in m["layers"] if m["kind"] != "hyv4" else []:
        p = f"layers.{layer['index']}."
        out = A(p + "attn.out")
        if not np.array_equal(out.astype(ml_dtypes.bfloat16).view(np.uint16), A(p + "attn.out_bf16").view(np.uint16)):
            errors.append(p + "attn.out_bf16 != bf16(attn.out)")
        ind = A(p + "attn.indices")[:, 0, :]
        s_kv = cfg["s_kv"]
        tl = A(p + "attn.topk_length") if p + "attn.topk_length" in t else np.full(ind.shape[0], ind.shape[1])
        for r in range(ind.shape[0]):
            valid = [(v >= 0 and v < s_kv) for v in ind[r, : tl[r]]]
            if not any(valid):
                if not (np.all(out[r] == 0) and np.all(np.isposinf(A(p + "attn.lse")[r]))):
                    errors.append(f"{p}: row {r} has no valid index but out != 0 or lse != +inf")
        if p + "indexer.topk" in t:
            ks, ke = A(p + "indexer.ks"), A(p + "indexer.ke")
            topk = A(p + "indexer.topk")
            logits = A(p + "indexer.logits") if p + "indexer.logits" in t else None
            for r in range(topk.shape[0]):
                n = ke[r] - ks[r]
                sel = [int(v) for v in topk[r] if v >= 0]
                if len(sel) != min(k, n) or len(set(sel)) != len(sel) or any(v >= n for v in sel):
                    errors.append(f"{p}indexer.topk row {r}: malformed {sel}")
                if logits is not None:
                    sc = [logits[r, ks[r] + v] for v in sel]
                    if any(sc[i] < sc[i + 1] for i in range(len(sc) - 1)):
                        errors.append(f"{p}indexer.topk row {r}: not in score order")
                    rest = [logits[r, s] for s in range(ks[r], ke[r]) if s - ks[r] not in set(sel)]
                    if rest and sc and max(rest) > min(sc):
                        errors.append(f"{p}indexer.topk row {r}: an unselected key scores higher")
                    if not np.all(np.isneginf(logits[r, : ks[r]])) or not np.all(np.isneginf(logits[r, ke[r]:])):
                        errors.append(f"{p}indexer.logits row {r}: not -inf outside [ks, ke)")
            if logits is not None and t[p + "indexer.q"][0] == "F8_E4M3":
                q = A(p + "indexer.q").astype(np.float64)
                kk = A(p + "indexer.k").astype(np.float64)
                w, ksc = A(p + "indexer.weights"), A(p + "indexer.k_scale")
                for r in (0, topk.shape[0] - 1):
                    for s in range(ks[r], ke[r]):
                        acc = 0.0
                        for h in range(q.shape[1]):
                            dot = float(np.dot(q[r, h], kk[s]))  # exact: integers times 2^-18
                            acc = acc + float(w[r, h]) * max(dot, 0.0)
                        if np.float32(acc * float(ksc[s])) != logits[r, s]:
                            errors.append(f"{p}indexer.logits[{r},{s}] differs from the NumPy recomputation")
                            break
        if p + "attn.indices_physical" in t:
            # Decode sets: physical = block_table[b, pos // page] * page + pos % page, -1 kept.
            bt, page = A("block_table"), A(p + "attn.kv_cache_fp8").shape[1]
            phys = A(p + "attn.indices_physical")
            b, nn = phys.shape[0], phys.shape[1]
            rows = ind.reshape(b, nn, -1)
            seq_kv = cfg["s_kv"] // b
            expect = np.where(rows >= 0, bt[np.arange(b)[:, None, None], (rows - np.arange(b)[:, None, None] * seq_kv) // page] * page
                              + (rows - np.arange(b)[:, None, None] * seq_kv) % page, -1)
            if not np.array_equal(expect, phys):
                errors.append(p + "attn.indices_physical != block_table mapping of attn.indices")
            cache = A(p + "attn.kv_cache_fp8")
            used = set(int(v) for v in phys.ravel() if v >= 0)
            flat = cache.reshape(-1, 656)
            lat = flat[:, :512].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            scales = flat[:, 512:528].copy().view(np.float32)
            deq = (lat.reshape(-1, 4, 128) * scales[:, :, None]).reshape(-1, 512).astype(ml_dtypes.bfloat16).astype(np.float32)
            kvd = A(p + "attn.kv")[:, 0, :512].astype(np.float32)
            for r in range(ind.shape[0]):
                for j in range(ind.shape[1]):
                    v = ind[r, j]
                    if v >= 0 and not np.array_equal(deq[phys.reshape(-1, phys.shape[2])[r, j]], kvd[v]):
                        errors.append(f"{p}: kv_cache_fp8 slot of row {v} does not dequantize to attn.kv")
            valid_slots = set()
            for bb in range(b):
                for pos in range(A("cache_seqlens")[bb]):
                    valid_slots.add(int(bt[bb, pos // page] * page + pos % page))
            unused = [s_ for s_ in range(flat.shape[0]) if s_ not in valid_slots]
            if unused and not np.all(np.isnan(lat[unused])):
                errors.append(p + "attn.kv_cache_fp8: an unused slot is not NaN")
        if layer["kind"] == "shared" and m["kind"] in ("stack", "decode"):
            src = f"layers.{layer['source']}."
            expect = A(src + "indexer.topk")
            ks = A(src + "indexer.ks")
            rows = np.where(expect >= 0, expect + ks[:, None], -1)
            if not np.array_equal(rows, ind):
                errors.append(f"{p}attn.indices are not the positions of source layer {layer['source']}")
    # Replay into a temporary folder: identical tensors.
    with tempfile.TemporaryDirectory() as tmp:
        args = shlex.split(m["replay"])
        assert args[0] == "indexshare" and "--out" in args
        args[0] = cli
        args[args.index("--out") + 1] = os.path.join(tmp, "g")
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            errors.append(f"replay failed: {r.stderr.strip()}")
        else:
            m2 = json.load(open(os.path.join(tmp, "g", "manifest.json")))
            a = {e["name"]: e["sha256"] for e in m["tensors"]}
            b = {e["name"]: e["sha256"] for e in m2["tensors"]}
            if a != b:
                errors.append("replay produced different tensors: " +
                              ", ".join(n for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n))[:400])
    return errors


def main():
    cli, root = sys.argv[1], sys.argv[2]
    sets = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "manifest.json")))
    passed = failed = 0
    for s in sets:
        errs = check_set(cli, os.path.join(root, s))
        if errs:
            failed += 1
            print(f"FAIL {s}:\n  " + "\n  ".join(errs[:20]))
        else:
            passed += 1
            print(f"ok   {s}")
    if not sets:
        print("no golden sets found under " + root)
        failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
