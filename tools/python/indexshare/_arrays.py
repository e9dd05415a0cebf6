"""Array plumbing: numpy (ml_dtypes for bf16 / e4m3) and torch CPU tensors in, the caller's framework out.

Inputs are checked here (device, dtype, rank) and every error names the argument. A C-contiguous input
reaches the C++ kernel without a copy: a torch tensor becomes a numpy view of the same memory, and C++
reads that memory in place (ref/tensor.h BorrowedTensor, a read-only view). A non-contiguous input is
copied once, here. Outputs are numpy arrays over the C++ result's storage (no copy), viewed as torch
tensors when the caller passed torch tensors. Do not write to an input while a call on it runs (the
GIL is released: another Python thread could). topk's fast path (kernels.py) skips these checks for
arrays that need none (fast_kind): the C++ binding's typed arguments check them instead.
"""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

# safetensors dtype names <-> numpy dtypes (the golden tensor contract, README "Tensor names").
ST_TO_NP = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": BF16,
    "F8_E4M3": E4M3, "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NP_TO_ST = {v: k for k, v in ST_TO_NP.items()}
# The raw integer type C++ receives for each element type (bf16 and e4m3 as their codes).
_RAW = {BF16: np.dtype(np.uint16), E4M3: np.dtype(np.uint8)}


def _torch():
    """torch if the caller has imported it (never imported here: torch is optional)."""
    return sys.modules.get("torch")


_torch_tensor = None  # torch.Tensor once torch is imported and has DLPack's C exchange API, else False


def fast_kind(*xs):
    """Which fast path of a kernel (kernels.py topk) may take xs: "numpy" when every x is a numpy array,
    "torch" when every x is a torch.Tensor (and torch has DLPack's C exchange API: torch 2.15 has), else
    None (the checked path). The C++ binding checks dtype, rank, layout and device."""
    for x in xs:
        if type(x) is not np.ndarray:
            break
    else:
        return "numpy"
    global _torch_tensor
    if _torch_tensor is None:
        t = _torch()
        if t is None:
            return None
        _torch_tensor = t.Tensor if hasattr(t.Tensor, "__dlpack_c_exchange_api__") else False
    for x in xs:
        if type(x) is not _torch_tensor:
            return None
    return "torch"


def is_torch(x) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _torch_to_numpy(x, name: str) -> np.ndarray:
    t = _torch()
    if not x.is_cpu:
        raise ValueError(f"{name}: a tensor on device '{x.device}'; indexshare computes on the CPU: pass {name}.cpu()")
    if x.requires_grad:  # (each torch call costs microseconds: detach only when needed)
        x = x.detach()
    if x.dtype == t.bfloat16:
        return x.view(t.int16).numpy().view(BF16)
    if x.dtype == t.float8_e4m3fn:
        return x.view(t.uint8).numpy().view(E4M3)
    if x.dtype == getattr(t, "float8_e5m2", None):
        return x.view(t.uint8).numpy().view(ST_TO_NP["F8_E5M2"])
    try:
        return x.numpy()
    except TypeError as e:
        raise TypeError(f"{name}: torch dtype {x.dtype} is not supported ({e})") from None


def to_numpy(x, name: str) -> np.ndarray:
    """A numpy view of x (a numpy array or a torch CPU tensor), without a copy."""
    if is_torch(x):
        return _torch_to_numpy(x, name)
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{name}: expected a numpy array or a torch CPU tensor, got {type(x).__name__}")


def dtype_name(d: np.dtype) -> str:
    return {BF16: "bfloat16", E4M3: "float8_e4m3fn"}.get(d, str(d))


def arg(x, name: str, dtypes, rank: int, dims: str) -> np.ndarray:
    """x checked and as C++ takes it: C-contiguous, of one of `dtypes`, rank `rank` ([dims] in errors),
    bf16 / e4m3 as their raw codes. Contiguous input: a view (same memory), else one copy."""
    a = to_numpy(x, name)
    dtypes = [np.dtype(d) for d in dtypes]
    if a.dtype not in dtypes:
        want = " or ".join(dtype_name(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {dtype_name(a.dtype)}")
    if a.ndim != rank:
        raise ValueError(f"{name}: expected rank {rank} [{dims}], got shape {list(a.shape)}")
    a = np.ascontiguousarray(a)
    return a.view(_RAW[a.dtype]) if a.dtype in _RAW else a


def optional_arg(x, name, dtypes, rank, dims):
    return None if x is None else arg(x, name, dtypes, rank, dims)


def wants_torch(*xs) -> bool:
    return any(is_torch(x) for x in xs)


def out(a: np.ndarray, torch: bool, dtype: np.dtype | None = None):
    """A C++ result (numpy over the C++ storage) in the caller's framework; dtype: view the raw codes as it."""
    if dtype is not None:
        a = a.view(dtype)
    if not torch:
        return a
    t = _torch()
    if a.dtype == BF16:
        return t.from_numpy(a.view(np.int16)).view(t.bfloat16)
    if a.dtype == E4M3:
        return t.from_numpy(a.view(np.uint8)).view(t.float8_e4m3fn)
    return t.from_numpy(a)


def from_raw(dtype: str, shape, raw: np.ndarray, framework: str):
    """A (safetensors dtype, shape, uint8 bytes) tensor of the C++ side as numpy (a read-only view of
    the C++ bytes) or torch (a copy: torch tensors are writable)."""
    a = raw.view(ST_TO_NP[dtype]).reshape(shape)
    if framework == "numpy":
        return a
    if framework != "torch":
        raise ValueError(f"framework: expected 'numpy' or 'torch', got {framework!r}")
    import torch  # noqa: F401  (imported on request)
    return out(a.copy(), True)


def to_raw(name: str, x) -> tuple:
    """A named tensor (numpy or torch CPU) as (name, safetensors dtype, shape, uint8 bytes) for C++."""
    a = to_numpy(x, name)
    if a.dtype not in NP_TO_ST:
        raise TypeError(f"{name}: dtype {dtype_name(a.dtype)} has no safetensors name")
    a = np.ascontiguousarray(a)
    return (name, NP_TO_ST[a.dtype], list(a.shape), a.reshape(-1).view(np.uint8))
