#!/usr/bin/env python3
"""Interop test: our bf16 and float8_e4m3fn encoders against the PyPI ml_dtypes package.

Usage: test_ml_dtypes.py PATH/TO/libindexshare_capi.so [--quick]

bf16: every one of the 2^32 float32 bit patterns (in chunks), code for code. For NaN inputs both
sides must give a NaN; the sign and payload of our NaN are checked too (0x7FC0 with the input's
sign, which is what ml_dtypes produces).

e4m3fn: every float32 bit pattern whose magnitude is at most 464 -- the range where the
conversion cannot overflow (464 is the midpoint between 448 and the missing 480 and ties to 448,
whose mantissa is even) and where our saturating rule and ml_dtypes' NaN-on-overflow rule agree.
Above 464 we check our documented saturation (to +-448) on a strided sample instead. All 256
codes are decoded and compared with ml_dtypes' decoding.

--quick samples every 7th pattern (for a fast local run); the default is exhaustive.
"""
import ctypes
import sys
import time

import ml_dtypes
import numpy as np

CHUNK = 1 << 24


def load(path):
    lib = ctypes.CDLL(path)
    for name in ("indexshare_f32_to_bf16", "indexshare_f32_to_e4m3", "indexshare_e4m3_to_f32"):
        getattr(lib, name).restype = None
    return lib


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_bf16(lib, step):
    ours = np.empty(CHUNK, dtype=np.uint16)
    n_checked = 0
    for start in range(0, 1 << 32, CHUNK):
        bits = np.arange(start, start + CHUNK, step, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        o = ours[: x.size]
        lib.indexshare_f32_to_bf16(ptr(x), ptr(o), ctypes.c_size_t(x.size))
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        nan_in = np.isnan(x)
        bad = (o != ref) & ~nan_in
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fail(f"bf16: input 0x{int(bits[i]):08x} ({x[i]!r}): ours 0x{int(o[i]):04x}, ml_dtypes 0x{int(ref[i]):04x}")
        if nan_in.any():
            on, rn = o[nan_in], ref[nan_in]
            if not (((on & 0x7FFF) > 0x7F80).all() and ((rn & 0x7FFF) > 0x7F80).all()):
                fail("bf16: a NaN input did not give NaN")
            expect = ((bits[nan_in] >> 16) & 0x8000).astype(np.uint16) | np.uint16(0x7FC0)
            if (on != expect).any():
                fail("bf16: NaN not encoded as 0x7FC0 with the input's sign")
        n_checked += x.size
    return n_checked


def check_e4m3(lib, step):
    # All patterns with |x| <= 464: positive 0 .. bits(464), and the same with the sign bit.
    limit = int(np.array([464.0], dtype=np.float32).view(np.uint32)[0])
    ours = np.empty(CHUNK, dtype=np.uint8)
    n_checked = 0
    for sign in (0, 0x80000000):
        for start in range(0, limit + 1, CHUNK):
            stop = min(start + CHUNK, limit + 1)
            bits = (np.arange(start, stop, step, dtype=np.uint64) | sign).astype(np.uint32)
            x = bits.view(np.float32)
            o = ours[: x.size]
            lib.indexshare_f32_to_e4m3(ptr(x), ptr(o), ctypes.c_size_t(x.size))
            ref = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            if (o != ref).any():
                i = int(np.flatnonzero(o != ref)[0])
                fail(f"e4m3: input 0x{int(bits[i]):08x} ({x[i]!r}): ours 0x{int(o[i]):02x}, ml_dtypes 0x{int(ref[i]):02x}")
            n_checked += x.size
    # Beyond 464: documented saturation to +-448 (codes 0x7E / 0xFE), infinities included.
    big = np.concatenate([np.arange(limit + 1, 0x7F800001, 997, dtype=np.uint64)]).astype(np.uint32)
    for sign, code in ((0, 0x7E), (0x80000000, 0xFE)):
        x = (big | np.uint32(sign)).view(np.float32)
        o = np.empty(x.size, dtype=np.uint8)
        lib.indexshare_f32_to_e4m3(ptr(x), ptr(o), ctypes.c_size_t(x.size))
        if (o != code).any():
            fail(f"e4m3: saturation beyond 464 gave code 0x{int(o[o != code][0]):02x}")
    # NaN keeps NaN (0x7F / 0xFF by sign).
    nans = np.array([0x7FC00000, 0x7F800001, 0xFFC00000, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    o = np.empty(4, dtype=np.uint8)
    lib.indexshare_f32_to_e4m3(ptr(nans), ptr(o), ctypes.c_size_t(4))
    if list(o) != [0x7F, 0x7F, 0xFF, 0xFF]:
        fail(f"e4m3: NaN codes {list(o)}")
    # Decoding: all 256 codes.
    codes = np.arange(256, dtype=np.uint8)
    dec = np.empty(256, dtype=np.float32)
    lib.indexshare_e4m3_to_f32(ptr(codes), ptr(dec), ctypes.c_size_t(256))
    ref = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    same = (dec.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(dec) & np.isnan(ref))
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        fail(f"e4m3 decode: code 0x{i:02x}: ours {dec[i]!r}, ml_dtypes {ref[i]!r}")
    return n_checked


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    lib = load(sys.argv[1])
    step = 7 if "--quick" in sys.argv[2:] else 1
    t0 = time.time()
    n = check_bf16(lib, step)
    t1 = time.time()
    print(f"bf16: {n} float32 inputs identical to ml_dtypes {ml_dtypes.__version__} ({t1 - t0:.1f} s)")
    n = check_e4m3(lib, step)
    print(f"e4m3fn: {n} float32 inputs with |x| <= 464 identical to ml_dtypes, saturation and "
          f"all 256 decodes checked ({time.time() - t1:.1f} s)")
    print("2 passed, 0 failed")


if __name__ == "__main__":
    with np.errstate(invalid="ignore", over="ignore"):
        main()
