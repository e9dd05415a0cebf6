#!/usr/bin/env python3
"""Regenerates the seed corpora of the libFuzzer targets in tests/fuzz/corpus/<target>/.

Usage: python3 tests/fuzz/make_corpus.py   (from anywhere; needs only the standard library)

Seeds are small (< 64 KB each). Candidates and manifests are derived from the small golden sets in
tests/fuzz/golden/ (edge and stack; regenerate them with the replay line of their manifest.json,
run from the repository root with --force), so rerun this script after regenerating them.
"""
import json
import math
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(ROOT, "golden")
SMALL = os.path.join(HERE, "golden")  # the small sets the manifest and diff targets run against
CORPUS = os.path.join(HERE, "corpus")
LIMIT = 64 * 1024


def read_st(path):
    """Returns (header dict, {name: (dtype, shape, bytes)}) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[b:end])
    return header, out


def st_bytes(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes) in file order."""
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def i32(values):
    return struct.pack("<%di" % len(values), *values)


def i64(values):
    return struct.pack("<%dq" % len(values), *values)


def bf16_to_f32_bytes(raw):
    n = len(raw) // 2
    codes = struct.unpack("<%dH" % n, raw)
    return struct.pack("<%dI" % n, *[c << 16 for c in codes])


class Corpus:
    def __init__(self, target):
        self.dir = os.path.join(CORPUS, target)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)

    def add(self, name, data):
        if isinstance(data, str):
            data = data.encode()
        assert len(data) < LIMIT, (self.dir, name, len(data))
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)


def safetensors_corpus():
    c = Corpus("fuzz_safetensors")
    c.add("one-f32", st_bytes([("a", "F32", [2, 2], f32([1, 2, 3, 4]))]))
    c.add("every-dtype", st_bytes([
        ("f64", "F64", [2], struct.pack("<2d", 1.5, -2)),
        ("f32", "F32", [3], f32([0.5, math.inf, -0.0])),
        ("f16", "F16", [1], b"\x00\x3c"),
        ("bf16", "BF16", [2], b"\x80\x3f\xc0\x7f"),
        ("e4m3", "F8_E4M3", [4], b"\x38\x7f\xff\x00"),
        ("e5m2", "F8_E5M2", [1], b"\x3c"),
        ("i64", "I64", [2], i64([-1, 2 ** 62])),
        ("i32", "I32", [1, 1], i32([-7])),
        ("i16", "I16", [1], b"\x01\x80"),
        ("i8", "I8", [1], b"\xff"),
        ("u8", "U8", [3], b"\x00\x01\xff"),
        ("bool", "BOOL", [1], b"\x01"),
    ], metadata={"format": "pt", "note": "seed"}))
    c.add("rank0-and-empty", st_bytes([("scalar", "F32", [], f32([3])), ("empty", "I32", [0, 4], b""),
                                       ("z", "U8", [1], b"\x05")]))
    c.add("metadata-only", st_bytes([], metadata={"k": "v"}))
    c.add("unpadded", st_bytes([("x", "I32", [3], i32([1, 2, 3]))], pad=False))
    c.add("unicode-name", st_bytes([("caf\u00e9.\u0394", "U8", [2], b"ab")]))
    # Refused inputs near the boundaries (the fuzzer mutates from here).
    c.add("bad-overlap", struct.pack("<Q", 96) + json.dumps(
        {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
         "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, separators=(",", ":")).encode().ljust(96) + b"012345")
    c.add("bad-length", struct.pack("<Q", 2 ** 63) + b"{}")
    c.add("bad-shape-overflow", st_bytes([("a", "F32", [2 ** 62, 8], b"")]))
    _, edge = read_st(os.path.join(GOLDEN, "attention-edge", "tensors.safetensors"))
    keep = ["layers.0.attn.lse", "layers.0.attn.max_logits", "layers.0.attn.indices", "layers.0.attn.sink",
            "layers.0.attn.topk_length", "layers.0.indexer.ks", "layers.0.indexer.ke"]
    c.add("golden-subset", st_bytes([(n,) + edge[n] for n in keep], metadata={"format": "indexshare-golden"}))


def problem_corpus():
    c = Corpus("fuzz_problem")
    seeds = [
        "",
        "sq128 skv512 hq16 dqk576 dv512 ih32 id128 k64 seed1 nl4 sched=FFFS recency=0.25 sinks=4",
        "sq1024 skv1024 hq64 dqk576 dv512 ih64 id128 k256 seed7",
        "sq64 skv4096 k2048 dist=ties sink=random",
        "sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed2 nl8 sched=glm-5.2 sim=0.85 recency=0.25 sinks=2",
        "sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4 seed3 nl3 sched=FSF indexer=bf16 scale=fp32_amax",
        "sq8 skv40 hq2 dqk16 dv8 ih2 id16 k4 nl3 sched=freq:2,offset:1 sm=0.125 sink=pinf own=no",
        "sq4 skv8 nl4 sched=list:full,shared,full,shared dist=narrow scale=flashmla_pow2 sink=ninf",
        "sq2 skv2 dist=dyadic sim=0 recency=1e-3 nl2 sched=pattern:FS",
        "dist=int dist=int",
        "sq8 skv4",
    ]
    for i, s in enumerate(seeds):
        c.add("seed-%02d" % i, s)


def schedule_corpus():
    c = Corpus("fuzz_schedule")
    seeds = [(8, "glm-5.2"), (78, "glm-5.2"), (4, "all-full"), (8, "one-full-three-shared"), (4, "FFSS"),
             (3, "pattern:FSF"), (8, "freq:4,offset:3"), (8, "offset:1,freq:4"), (5, "freq:2"),
             (4, "list:full,shared,shared,full"), (0, "all-full"), (-3, "FS"), (2, "SF"), (4, "freq:4,offset:-1")]
    for i, (n, s) in enumerate(seeds):
        c.add("seed-%02d" % i, struct.pack("b", n) + s.encode())


def manifest_corpus():
    c = Corpus("fuzz_manifest")
    path = os.path.join(SMALL, "edge", "manifest.json")
    with open(path, "rb") as f:
        text = f.read()
    c.add("edge.json", text)
    m = json.loads(text)
    c.add("edge-compact.json", json.dumps(m, separators=(",", ":")))

    def variant(name, edit):
        v = json.loads(text)
        edit(v)
        c.add(name, json.dumps(v, indent=1))
    variant("version-2.json", lambda v: v.update(format_version=2))
    variant("one-tensor-short.json", lambda v: v["tensors"].pop())
    variant("shape-mismatch.json", lambda v: v["tensors"][0].update(shape=[8, 2, 15]))
    variant("no-budgets.json", lambda v: v.pop("budgets"))
    variant("shared-layer.json", lambda v: v["layers"].append({"index": 1, "kind": "shared", "source": 0, "has_indexer": False}))


def faithful(tensors, layer, full, names=("attn.out", "attn.lse", "attn.max_logits", "attn.indices", "indexer.topk",
                                          "indexer.logits")):
    """A candidate that reproduces layer `layer` of a golden as a correct kernel reports it."""
    p = "layers.%d." % layer
    out = []
    for n in names:
        if n == "attn.out":
            out.append((p + n, "BF16") + tensors[p + "attn.out_bf16"][1:])
        elif n.startswith("indexer.") and (not full or p + n not in tensors):
            continue
        else:
            out.append((p + n,) + tensors[p + n])
    return out


def diff_corpus():
    c = Corpus("fuzz_diff")
    _, edge = read_st(os.path.join(SMALL, "edge", "tensors.safetensors"))
    p = "layers.0."
    # The edge set's attn.indices are deliberately malformed inputs: a faithful candidate leaves them out.
    c.add("edge-faithful", st_bytes(faithful(edge, 0, True, ("attn.out", "attn.lse", "attn.max_logits", "indexer.topk",
                                                              "indexer.logits"))))
    c.add("edge-with-indices", st_bytes(faithful(edge, 0, True)))
    ind = edge[p + "attn.indices"]
    c.add("edge-indices-i64", st_bytes([(p + "attn.indices", "I64", ind[1],
                                         i64(struct.unpack("<%di" % (len(ind[2]) // 4), ind[2])))]))
    ml = bytearray(edge[p + "attn.max_logits"][2])
    ml[4:8] = f32([math.nan])
    c.add("edge-max-logits-nan", st_bytes([(p + "attn.max_logits", "F32", edge[p + "attn.max_logits"][1], bytes(ml))]))
    out = edge[p + "attn.out"]
    c.add("edge-out-f32", st_bytes([(p + "attn.out",) + out]))
    _, stack = read_st(os.path.join(SMALL, "stack", "tensors.safetensors"))
    every = []
    for layer, full in enumerate((True, False, True, False)):  # FSFS
        every += faithful(stack, layer, full)
        c.add("stack-layer%d" % layer, st_bytes(faithful(stack, layer, full)))
    c.add("stack-every-layer", st_bytes(every))
    # A tie-permuted / wrong selection: layer 2's top-k reversed, and layer 3 using layer 0's positions.
    topk = stack["layers.2.indexer.topk"]
    vals = list(struct.unpack("<%di" % (len(topk[2]) // 4), topk[2]))
    k = topk[1][1]
    rows = [vals[i:i + k][::-1] for i in range(0, len(vals), k)]
    c.add("stack-topk-reversed", st_bytes([("layers.2.indexer.topk", "I32", topk[1], i32(sum(rows, [])))]))
    c.add("stack-wrong-source", st_bytes([("layers.3.attn.indices",) + stack["layers.0.attn.indices"],
                                          ("layers.3.attn.out", "BF16") + stack["layers.3.attn.out_bf16"][1:]]))


def regressions():
    """Inputs that once crashed a target (tests/fuzz/regressions/<target>/): run.sh replays them first."""
    def add(target, name, data):
        d = os.path.join(HERE, "regressions", target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
    # nl was truncated to int when the schedule was built, and unbounded.
    add("fuzz_problem", "nl-truncated-to-int", "nl44444444444432")
    add("fuzz_problem", "nl-huge", "sq4 skv8 nl2147483647")
    with open(os.path.join(SMALL, "edge", "manifest.json")) as f:
        text = f.read()

    def manifest(name, edit):
        m = json.loads(text)
        edit(m)
        add("fuzz_manifest", name, json.dumps(m, indent=1))
    # Fields golden::read did not check and its consumers used unchecked.
    manifest("no-config.json", lambda m: m.pop("config"))
    manifest("no-budgets.json", lambda m: m.pop("budgets"))
    manifest("kind-number.json", lambda m: m.update(kind=5))
    manifest("layers-number.json", lambda m: m.update(layers=5))
    manifest("source-out-of-range.json", lambda m: m["layers"][0].update(source=100000))
    manifest("sm-scale-beyond-float.json", lambda m: m["config"].update(sm_scale=1e300))
    manifest("budget-entry-empty.json", lambda m: m["budgets"].update({"layers.0.attn.out": {}}))
    manifest("budget-entry-number.json", lambda m: m["budgets"].update({"layers.0.attn.out": 5}))
    manifest("budget-entry-string.json", lambda m: m["budgets"]["layers.0.attn.out"].update(budget_max_abs="x"))


if __name__ == "__main__":
    regressions()
    safetensors_corpus()
    problem_corpus()
    schedule_corpus()
    manifest_corpus()
    diff_corpus()
    for t in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, t))
        print("%-18s %2d seeds, largest %d bytes" % (t, len(files), max(os.path.getsize(os.path.join(CORPUS, t, f)) for f in files)))
