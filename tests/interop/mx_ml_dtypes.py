#!/usr/bin/env python3
"""mx_ml_dtypes.py - mixprec's MX block formats against ml_dtypes (Google's
NumPy types float8_e4m3fn, float8_e5m2, float6_e2m3fn, float6_e3m2fn,
float4_e2m1fn and float8_e8m0fnu): the library is called through ctypes,
and the reference is the OCP MX conversion written here with NumPy (scale
from the block amax with frexp, the division in float64, the rounding to the
element type done by ml_dtypes' own casts). Run by tests/test_mx.c.

  mx_ml_dtypes.py LIBMIXPREC.so

Exit status: 0 all checks passed, 1 a check failed, 2 usage or the library
would not load, 77 skipped (numpy or ml_dtypes not importable by this
Python; `make ref-venv` installs ml_dtypes from PyPI into build/venv-ref,
which tests/run.sh then uses; .ci/run does so).
"""
import ctypes
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:
    print(f"mx_ml_dtypes: skipped ({e.name} is not importable by {sys.executable})")
    sys.exit(77)

# mp_mx_format values, the element type, its largest value and emax_elem
FORMATS = [
    ("mxfp8_e4m3", 0, ml_dtypes.float8_e4m3fn, 448.0, 8),
    ("mxfp8_e5m2", 1, ml_dtypes.float8_e5m2, 57344.0, 15),
    ("mxfp6_e2m3", 2, ml_dtypes.float6_e2m3fn, 7.5, 2),
    ("mxfp6_e3m2", 3, ml_dtypes.float6_e3m2fn, 28.0, 4),
    ("mxfp4_e2m1", 4, ml_dtypes.float4_e2m1fn, 6.0, 2),
    ("mxint8", 5, None, 127 / 64, 0),
]
MP_F32, MP_BF16 = 0, 2


def sample(n, seed):
    """Blocks at scales from 2^-140 to 2^120, ties of the small grids, zeros
    of both signs, float32 subnormals, and a few inf and NaN."""
    rng = np.random.default_rng(seed)
    x = np.empty(n, dtype=np.float32)
    for b in range(0, n, 32):
        m = min(32, n - b)
        kind = rng.integers(5)
        k = int(rng.integers(-140, 120))
        if kind == 0:
            v = np.ldexp(rng.uniform(-2, 2, m), k - rng.integers(0, 20, m))
        elif kind == 1:
            v = np.ldexp((rng.integers(-256, 256, m) + 0.5) / 16, k // 4)
        elif kind == 2:
            v = rng.integers(0, 1 << 23, m).astype(np.uint32).view(np.float32) * rng.choice([-1, 1], m)
        elif kind == 3:
            v = np.where(rng.random(m) < 0.5, -0.0, 0.0)
        else:
            v = rng.uniform(-1, 1, m) * 1e3
            v[rng.integers(m)] = rng.choice([np.inf, -np.inf, np.nan])
        x[b:b + m] = v
    return x


def reference(x, name, dtype, vmax, emax):
    """E8M0 codes, and the element values (float64) by the OCP MX rule."""
    n = len(x)
    nb = (n + 31) // 32
    pad = np.zeros(nb * 32, dtype=np.float64)
    pad[:n] = x
    blocks = pad.reshape(nb, 32)
    special = ~np.isfinite(blocks).all(axis=1)
    amax = np.abs(np.where(np.isfinite(blocks), blocks, 0)).max(axis=1)
    e = np.frexp(amax)[1] - 1  # floor(log2(amax)) for amax > 0
    se = np.clip(np.where(amax > 0, e - emax, -127), -127, 127)
    codes = np.where(special, 255, se + 127).astype(np.uint8)
    q = np.clip(np.ldexp(np.where(special[:, None], 0, blocks), -se[:, None]), -vmax, vmax)
    if dtype is None:
        vals = np.rint(q * 64) / 64 + 0.0  # MXINT8: nearest even, no -0
    else:
        vals = q.astype(dtype).astype(np.float64)
    return codes, se, vals.reshape(-1)[:n]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        lib = ctypes.CDLL(sys.argv[1])
    except OSError as e:
        print(f"mx_ml_dtypes: cannot load {sys.argv[1]}: {e}", file=sys.stderr)
        return 2
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.mp_mx_pack.argtypes = [ctypes.c_int, ctypes.c_int, vp, sz, vp, vp]
    lib.mp_mx_unpack.argtypes = [ctypes.c_int, ctypes.c_int, vp, vp, sz, vp, ctypes.c_int]
    lib.mp_isa_name.restype = ctypes.c_char_p
    bad = 0
    for isa in range(3):  # every path this CPU runs (mp_isa_set)
        if lib.mp_isa_supported(isa) and lib.mp_isa_set(isa) == 0:
            bad += check(lib, lib.mp_isa_name(isa).decode())
    return 1 if bad else 0


def check(lib, isa):
    bad = 0
    n = 32 * 4096 + 13
    for name, f, dtype, vmax, emax in FORMATS:
        x = sample(n, 11 + f)
        nb = (n + 31) // 32
        ncode = (n + 1) // 2 if f == 4 else n
        codes = np.zeros(ncode, dtype=np.uint8)
        scales = np.zeros(nb, dtype=np.uint8)
        out = np.zeros(n, dtype=np.float32)
        if lib.mp_mx_pack(f, 32, x.ctypes.data, n, codes.ctypes.data, scales.ctypes.data):
            print(f"mx_ml_dtypes: {name}: mp_mx_pack failed")
            return 1
        lib.mp_mx_unpack(f, 32, codes.ctypes.data, scales.ctypes.data, n, out.ctypes.data, MP_F32)
        want_sc, se, want = reference(x, name, dtype, vmax, emax)
        ok_scale = scales == want_sc
        # the scales decoded by ml_dtypes' E8M0 type
        e8 = scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
        ok_scale &= np.where(want_sc == 255, np.isnan(e8), e8 == np.ldexp(1.0, se))
        if f == 4:
            el = np.stack([codes & 15, codes >> 4], axis=1).reshape(-1)[:n]
        else:
            el = codes
        got = el.view(np.int8) / 64.0 if dtype is None else el.view(dtype).astype(np.float64)
        live = np.repeat(want_sc != 255, 32)[:n]
        ok_el = ~live | ((got == want) & (np.signbit(got) == np.signbit(want)))
        ok_el &= live | (el == 0)
        dec = np.ldexp(want, np.repeat(se, 32)[:n]).astype(np.float32)
        ok_out = np.where(live, (out == dec) & (np.signbit(out) == np.signbit(dec)),
                          out.view(np.uint32) == 0x7FC00000)
        for what, ok in (("scale", ok_scale), ("element", ok_el), ("unpack", ok_out)):
            if not ok.all():
                i = int(np.argmin(ok))
                print(f"mx_ml_dtypes: {name} ({isa}): {what} {i} differs "
                      f"(input {x[min(i, n - 1)]!r})")
                bad += 1
        if not bad:
            print(f"mx_ml_dtypes: {name} ({isa}): {n} elements, {nb} scales agree with "
                  f"ml_dtypes {ml_dtypes.__version__}")
    return bad


if __name__ == "__main__":
    sys.exit(main())
