"""The kernels on arbitrary inputs: the golden sets' bits (ref and simd, numpy and torch), zero-copy
arguments and results, every bad-input path, the GIL released, the thread count."""
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import torch

import indexshare
from indexshare import _arrays

BF16, E4M3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn


def same(a, b):
    """Equal dtype, shape and bytes (numpy or torch, either side)."""
    a, b = (_arrays.to_numpy(x, "x") if isinstance(x, torch.Tensor) else np.asarray(x) for x in (a, b))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module", params=["glm-5.2", "ties", "attention-edge"])
def gset(request, root):
    return indexshare.load_golden(root / "golden" / request.param)


@pytest.mark.parametrize("impl", ["ref", "simd"])
@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_kernels_reproduce_the_golden_bits(gset, impl, fw):
    t = gset.tensors
    cfg = gset.config
    conv = (lambda a: a) if fw == "numpy" else (lambda a: _arrays.out(np.array(a), True))
    layers = sorted({int(n.split(".")[1]) for n in t if n.startswith("layers.")})
    checked = 0
    for l in layers:
        p = f"layers.{l}."
        if p + "indexer.q" in t and p + "indexer.topk" in t:
            args = [conv(t[p + "indexer." + n]) for n in ("q", "k", "k_scale", "weights", "ks", "ke")]
            if p + "indexer.logits" in t:
                logits = indexshare.indexer_logits(*args, impl=impl)
                assert isinstance(logits, torch.Tensor) == (fw == "torch")
                assert same(logits, t[p + "indexer.logits"])
                assert same(indexshare.topk(logits, args[4], args[5], cfg["topk"], impl=impl), t[p + "indexer.topk"])
            assert same(indexshare.indexer_topk(*args, cfg["topk"], impl=impl), t[p + "indexer.topk"])
            checked += 1
        if p + "attn.out" in t:
            a = indexshare.sparse_attention(conv(t[p + "attn.q"]), conv(t[p + "attn.kv"]), conv(t[p + "attn.indices"]),
                                            cfg["sm_scale"], cfg["d_v"],
                                            topk_length=conv(t[p + "attn.topk_length"]) if p + "attn.topk_length" in t else None,
                                            sink=conv(t[p + "attn.sink"]) if p + "attn.sink" in t else None, impl=impl)
            for n in ("out", "out_bf16", "max_logits", "lse"):
                assert same(getattr(a, n), t[p + "attn." + n]), (l, n)
            checked += 1
    assert checked > 0


def test_dense_equals_sparse_over_every_key():
    rng = np.random.default_rng(1)
    s_q, s_kv, h, d = 4, 8, 2, 64
    q = rng.standard_normal((s_q, h, d)).astype(BF16)
    kv = rng.standard_normal((s_kv, 1, d)).astype(BF16)
    ks = np.zeros(s_q, np.int32)
    ke = np.arange(s_kv - s_q + 1, s_kv + 1, dtype=np.int32)
    idx = np.where(np.arange(s_kv)[None, :] < ke[:, None], np.arange(s_kv)[None, :], -1).astype(np.int32)[:, None, :]
    for impl in ("ref", "simd"):
        dense = indexshare.dense_attention(q, kv, 0.125, 32, ks, ke, impl=impl)
        sparse = indexshare.sparse_attention(q, kv, idx, 0.125, 32, impl=impl)
        for n in dense._fields:
            assert same(getattr(dense, n), getattr(sparse, n))
        assert getattr(dense, "out_bf16").dtype == BF16


def test_run_stack_equals_the_cli_golden(root):
    g = indexshare.load_golden(root / "golden/glm-5.2")
    problem = g.manifest["problem"]
    for impl in ("ref", "simd"):
        for L in indexshare.run_stack(problem, impl=impl):
            p = f"layers.{L['layer']}."
            assert L["kind"] == g.layers[L["layer"]]["kind"]
            for n in ("out", "out_bf16", "lse", "max_logits", "indices"):
                assert same(L[n], g.tensors[p + "attn." + n]), (impl, L["layer"], n)
    # Given inputs (the golden's own, as torch tensors) give the same outputs, in torch.
    names = tuple(".indexer." + n for n in ("q", "k", "k_scale", "weights", "ks", "ke")) + (".attn.q", ".attn.kv")
    inputs = {n: _arrays.out(np.array(a), True) for n, a in g.tensors.items() if n.endswith(names)}
    outs = indexshare.run_stack(problem, inputs=inputs)
    assert isinstance(outs[0]["out"], torch.Tensor)
    for L in outs:
        assert same(L["out"], g.tensors[f"layers.{L['layer']}.attn.out"])


def test_contiguous_arguments_and_results_are_not_copied():
    q = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    a = _arrays.arg(q, "q", [_arrays.BF16], 3, "s_q, h_q, d_qk")
    assert a.ctypes.data == q.data_ptr()  # the same memory: no copy on the way to C++
    n = np.zeros((4, 2, 64), BF16)
    assert _arrays.arg(n, "q", [_arrays.BF16], 3, "").ctypes.data == n.ctypes.data
    strided = np.zeros((4, 2, 128), BF16)[:, :, ::2]
    assert _arrays.arg(strided, "q", [_arrays.BF16], 3, "").ctypes.data != strided.ctypes.data  # one copy
    kv = torch.zeros(8, 1, 64, dtype=torch.bfloat16)
    idx = torch.zeros(4, 1, 2, dtype=torch.int32)
    r = indexshare.sparse_attention(q, kv, idx, 0.1, 32)
    # The result wraps the C++ tensor's storage: the numpy array does not own it, torch shares it.
    raw = indexshare.sparse_attention(q.view(torch.int16).numpy().view(BF16), kv.view(torch.int16).numpy().view(BF16),
                                      idx.numpy(), 0.1, 32).out
    assert not raw.flags.owndata and raw.base is not None
    assert isinstance(r.out, torch.Tensor) and r.out_bf16.dtype == torch.bfloat16


def ptr(x):
    return x.data_ptr() if isinstance(x, torch.Tensor) else x.ctypes.data


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_the_kernels_read_the_callers_memory(root, fw):
    """Zero-copy into C++: the tensors each kernel reads (ref/tensor.h BorrowedTensor) have the caller's
    data pointers (the binding records them: _core.last_input_pointers); a strided input is copied once."""
    from indexshare._core_loader import core
    t = indexshare.load_golden(root / "golden" / "ties").tensors
    conv = (lambda a: np.array(a)) if fw == "numpy" else (lambda a: _arrays.out(np.array(a), True))
    p = "layers.0."
    ix = [conv(t[p + "indexer." + n]) for n in ("q", "k", "k_scale", "weights", "ks", "ke")]
    q, kv, idx = (conv(t[p + "attn." + n]) for n in ("q", "kv", "indices"))
    logits = conv(t[p + "indexer.logits"])
    tl = conv(np.full(q.shape[0], 3, np.int32))
    sink = conv(np.zeros(q.shape[1], np.float32))
    ks, ke = ix[4], ix[5]
    for impl in ("ref", "simd"):
        calls = [
            (lambda: indexshare.indexer_logits(*ix, impl=impl), ix),
            (lambda: indexshare.topk(logits, ks, ke, 4, impl=impl), [logits, ks, ke]),
            (lambda: indexshare.indexer_topk(*ix, 4, impl=impl), ix),
            (lambda: indexshare.sparse_attention(q, kv, idx, 0.1, 32, topk_length=tl, sink=sink, impl=impl),
             [q, kv, idx, tl, sink]),
            (lambda: indexshare.sparse_attention(q, kv, idx, 0.1, 32, impl=impl), [q, kv, idx, None, None]),
            (lambda: indexshare.dense_attention(q, kv, 0.1, 32, ks, ke, sink=sink, impl=impl), [q, kv, ks, ke, sink]),
        ]
        for i, (call, args) in enumerate(calls):
            call()
            want = [0 if a is None else ptr(a) for a in args]
            assert core().last_input_pointers() == want, (impl, i)
    # Non-contiguous: copied (once, in Python), so the kernel reads another buffer.
    wide = conv(np.repeat(np.array(t[p + "attn.q"]), 2, axis=2))
    strided = wide[:, :, ::2]
    r = indexshare.sparse_attention(strided, kv, idx, 0.1, 32)
    assert core().last_input_pointers()[0] != ptr(wide)
    assert same(r.out, indexshare.sparse_attention(q, kv, idx, 0.1, 32).out)


def test_bad_inputs_raise_naming_the_argument():
    q = np.zeros((4, 2, 64), BF16)
    kv = np.zeros((8, 1, 64), BF16)
    idx = np.zeros((4, 1, 2), np.int32)
    sa = indexshare.sparse_attention
    with pytest.raises(ValueError, match=r"q: a tensor on device 'meta'.*\.cpu\(\)"):
        sa(torch.zeros(4, 2, 64, dtype=torch.bfloat16, device="meta"), kv, idx, 0.1, 32)
    with pytest.raises(TypeError, match="kv: expected dtype bfloat16, got float32"):
        sa(q, kv.astype(np.float32), idx, 0.1, 32)
    with pytest.raises(TypeError, match="indices: expected dtype int32, got int64"):
        sa(q, kv, idx.astype(np.int64), 0.1, 32)
    with pytest.raises(ValueError, match=r"indices: expected rank 3 \[s_q, 1, topk\], got shape \[4, 2\]"):
        sa(q, kv, idx[:, 0], 0.1, 32)
    with pytest.raises(ValueError, match="kv"):
        sa(q, np.zeros((8, 1, 32), BF16), idx, 0.1, 32)  # d_qk differs from q's
    with pytest.raises(ValueError, match="sink"):
        sa(q, kv, idx, 0.1, 32, sink=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="q: expected a numpy array or a torch CPU tensor, got list"):
        sa([[1]], kv, idx, 0.1, 32)
    with pytest.raises(ValueError, match="impl"):
        sa(q, kv, idx, 0.1, 32, impl="cuda")
    il = indexshare.indexer_logits
    q8, k8 = np.zeros((4, 2, 16), E4M3), np.zeros((8, 16), E4M3)
    f = np.zeros
    with pytest.raises(TypeError, match="k: expected dtype float8_e4m3fn, got float32"):
        il(q8, k8.astype(np.float32), f(8, np.float32), f((4, 2), np.float32), f(4, np.int32), f(4, np.int32))
    with pytest.raises(ValueError, match="ke"):
        il(q8, k8, f(8, np.float32), f((4, 2), np.float32), f(4, np.int32), np.full(4, 9, np.int32))  # beyond s_kv
    with pytest.raises(ValueError, match="weights"):
        il(q8, k8, f(8, np.float32), f((4, 3), np.float32), f(4, np.int32), f(4, np.int32))
    with pytest.raises(ValueError, match="NaN"):
        logits = np.full((1, 4), np.nan, np.float32)
        indexshare.topk(logits, np.zeros(1, np.int32), np.full(1, 4, np.int32), 2)


def test_topk_fast_path_takes_only_what_it_can_pass_unchanged():
    """topk hands C-contiguous numpy arrays or torch tensors straight to C++ (kernels.py fast path; the
    binding's typed arguments refuse without converting); everything else goes the checked way: the same
    results, the same errors naming the argument, a copy only for a non-contiguous input."""
    from indexshare._core_loader import core
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((8, 64)).astype(np.float32)
    logits[:, 5] = logits[:, 9]  # a tie: index ascending
    ks, ke = np.array([0, 1, 2, 3, 0, 0, 10, 60], np.int32), np.array([64, 64, 40, 3, 1, 64, 20, 64], np.int32)
    want = indexshare.topk(logits, ks, ke, 16, impl="ref")
    assert type(want) is np.ndarray and want.dtype == np.int32 and want.shape == (8, 16)
    tt = [torch.from_numpy(a) for a in (logits, ks, ke)]
    for impl in ("ref", "simd"):
        r = indexshare.topk(*tt, 16, impl=impl)
        assert type(r) is torch.Tensor and r.dtype == torch.int32 and same(r, want)
        r[0, 0] = -7  # a torch result owns its memory (the C++ tensor, via DLPack): writable, freed with it
        assert same(indexshare.topk(tt[0].requires_grad_(True), *tt[1:], 16, impl=impl), want)
        tt[0].requires_grad_(False)
        assert isinstance(indexshare.topk(tt[0], ks, ke, 16, impl=impl), torch.Tensor)  # mixed: checked path
        fortran = np.asfortranarray(logits)
        assert same(indexshare.topk(fortran, ks, ke, 16, impl=impl), want)
        assert core().last_input_pointers()[0] != fortran.ctypes.data  # copied once (C order) on the checked path
        assert same(indexshare.topk(tt[0].t().contiguous().t(), *tt[1:], 16, impl=impl), want)
        rows = torch.cat([tt[0][:2], tt[0]])[2:]  # contiguous, at a storage offset: read in place
        assert same(indexshare.topk(rows, *tt[1:], 16, impl=impl), want)
        assert core().last_input_pointers()[0] == rows.data_ptr() != rows.untyped_storage().data_ptr()
    with pytest.raises(TypeError, match="logits: expected dtype float32, got float64"):
        indexshare.topk(logits.astype(np.float64), ks, ke, 16)  # never converted silently
    # The fast path is the one taken (no check in Python): with the checked path's argument check broken,
    # plain numpy arrays and torch tensors still pass, a mixed call does not.
    import indexshare._arrays as arrays_module
    real = arrays_module.arg
    arrays_module.arg = None
    try:
        assert same(indexshare.topk(logits, ks, ke, 16), want)
        assert same(indexshare.topk(*[torch.from_numpy(a) for a in (logits, ks, ke)], 16), want)
        assert core().last_input_pointers() == [logits.ctypes.data, ks.ctypes.data, ke.ctypes.data]
        with pytest.raises(TypeError):
            indexshare.topk(torch.from_numpy(logits), ks, ke, 16)
    finally:
        arrays_module.arg = real
    with pytest.raises(TypeError, match="ke: expected dtype int32, got int64"):
        indexshare.topk(*tt[:2], tt[2].long(), 16)
    with pytest.raises(ValueError, match=r"logits: expected rank 2 \[s_q, s_kv\], got shape \[1, 8, 64\]"):
        indexshare.topk(logits[None], ks, ke, 16)
    with pytest.raises(ValueError, match=r"logits: a tensor on device 'meta'.*\.cpu\(\)"):
        indexshare.topk(torch.zeros(8, 64, device="meta"), *tt[1:], 16)
    with pytest.raises(ValueError, match="impl"):
        indexshare.topk(logits, ks, ke, 16, impl="cuda")
    with pytest.raises(ValueError, match="ke"):
        indexshare.topk(logits, ks, np.full(8, 65, np.int32), 16)  # beyond s_kv: ref/'s message, either path


def test_the_gil_is_released_and_threads_are_settable():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((256, 16, 576)).astype(BF16)
    kv = rng.standard_normal((2048, 1, 576)).astype(BF16)
    idx = rng.integers(0, 2048, (256, 1, 512)).astype(np.int32)
    ticks = []
    done = threading.Event()

    def spin():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t0 = time.perf_counter()
    th = threading.Thread(target=spin)
    th.start()
    try:
        indexshare.sparse_attention(q, kv, idx, 0.04, 512, impl="ref")
    finally:
        t1 = time.perf_counter()
        done.set()
        th.join()
    during = [t for t in ticks if t0 < t < t1]
    assert t1 - t0 > 0.05 and len(during) >= 10, (t1 - t0, len(during))  # the other thread ran meanwhile
    before = indexshare.get_num_threads()
    indexshare.set_num_threads(1)
    assert indexshare.get_num_threads() == 1
    one = indexshare.sparse_attention(q[:32], kv, idx[:32], 0.04, 512)
    indexshare.set_num_threads(2)
    two = indexshare.sparse_attention(q[:32], kv, idx[:32], 0.04, 512)
    assert one.out.tobytes() == two.out.tobytes()
    indexshare.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        indexshare.set_num_threads(0)
