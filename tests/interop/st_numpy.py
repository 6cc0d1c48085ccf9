#!/usr/bin/python3
"""st_numpy.py - an independent safetensors reader/writer (json, struct and
numpy only; no safetensors package, no mixprec code) for the interop test
tests/test_interop.c. Run with Debian's /usr/bin/python3 (python3-numpy).

  st_numpy.py check FILE              check a file of the agreed formula (below)
  st_numpy.py check CHECKPOINT PRED   check a mixprec checkpoint and the
                                      predictions file written next to it
  st_numpy.py write FILE              write the formula tensors and a small
                                      model's weights for the C side
Exit status: 0 all checks passed, 1 a check failed, 2 usage or unreadable file.

File format: u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the little-endian data (offsets relative to the end of the header).

Agreed formula, version 1 (the same text heads tests/test_interop.c); element
i counts row-major:
  f32          F32 [4, 6]  (i - 7) * 0.375
  f32_special  F32 [9]     -0, 2^-149, -2^-149, 2^-126, FLT_MAX, -FLT_MAX, +inf, -inf, NaN
  f16, bf16, e4m3, e5m2    (F16, BF16, F8_E4M3, F8_E5M2), 1-D: (i - 7) * 0.25 for
               i < 16, then -0, s, -s, 3s, n, -1.5n, M, -M, +inf, -inf (only
               formats with inf), NaN; s = smallest subnormal, n = smallest
               normal, M = largest finite: F16 2^-24 2^-14 65504; BF16 2^-133
               2^-126 (2 - 2^-7) 2^127; E4M3 2^-9 2^-6 448; E5M2 2^-16 2^-14 57344.
               All exactly representable.
  h(i) = (i * 2654435761) mod 2^32
  rne_src      F32 [4096]  bits (h & 0xFFFF0000) | (h & 0xFFFF, 0x8000, 0x7FFF, 0x8001)[i % 4]
  rne_bf16     BF16 [4096] rne_src rounded to nearest even (NaN stays NaN, same sign)
  rne_f16_src  F32 [4096]  sign: bit 31 of h; biased exponent 103 + (h >> 24) % 41
               (2^-24 .. 2^16: float16 subnormals to overflow); fraction
               (h & 0x7FE000) | (h & 0x1FFF, 0x1000, 0x0FFF, 0x1001)[i % 4]
  rne_f16      F16 [4096]  rne_f16_src rounded to nearest even (overflow: inf)
  C -> Python only (mixprec's decoders against this file's):
  e4m3_codes, e5m2_codes  [256] code i; f16_codes, bf16_codes [65536] code i;
  <x>_decoded  F32, the codes decoded by mixprec (NaN compared as NaN with its sign)
  metadata     interop.formula = "1", interop.text = "gr\u00fc\u00dfe \"quoted\" \\ back"
  Python -> C only: dense.kernel F32 [4, 3] (3r + c - 5) * 0.125,
               dense.bias F32 [3] (c - 1) * 0.5 (a Dense 4 -> 3 named "dense")

Checkpoint check: every Dense layer of mixprec.config has <name>.kernel
[in, units] and <name>.bias [units] (finite float32), the optimizer state
optimizer/<param>/<slot> exists for every parameter with the slots of the
optimizer in mixprec.training, which counts TRAIN_STEPS applied steps; then a
float64 forward pass from the file's float32 weights on PRED's "inputs" must
match PRED's "predictions" (float32, computed by mixprec) within a bound
derived from float32 rounding (see forward()).
"""
import json
import math
import struct
import sys

import numpy as np

TRAIN_STEPS = 6  # the C side trains exactly this many (applied) steps
TEXT = 'gr\u00fc\u00dfe "quoted" \\ back'
WIDTH = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
RAW = {"F32": "<u4", "F16": "<u2", "BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1"}
U = 2.0 ** -24  # float32 unit roundoff


class Failed(Exception):
    pass


# ------------------------------------------------------------- reader/writer
def read(path):
    """{name: (dtype, shape, raw array)}, metadata; validates the layout."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Failed(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise Failed(f"{path}: header length {n} past the end of the file")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise Failed(f"{path}: duplicate key in the header")
        return dict(pairs)

    header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors, spans = {}, []
    for name, e in header.items():
        dt, shape, (b, end) = e["dtype"], list(e["shape"]), e["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64))
        if dt not in WIDTH or count * WIDTH[dt] != end - b or not 0 <= b <= end <= len(data):
            raise Failed(f"{path}: tensor {name}: bad dtype/shape/offsets {e}")
        spans.append((b, end, name))
        tensors[name] = (dt, shape, np.frombuffer(data[b:end], RAW[dt]).reshape(shape))
    pos = 0  # the spans must tile the data section exactly
    for b, end, name in sorted(spans):
        if b != pos:
            raise Failed(f"{path}: tensor {name} starts at {b}, expected {pos}")
        pos = end
    if pos != len(data):
        raise Failed(f"{path}: {len(data) - pos} bytes after the last tensor")
    return tensors, meta


def write(path, tensors, meta):
    """tensors: [(name, dtype, shape, raw array)], stored in that order."""
    header, pos = {}, 0
    for name, dt, shape, raw in tensors:
        nbytes = raw.size * WIDTH[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    header["__metadata__"] = meta
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, dt, _, raw in tensors:
            f.write(np.ascontiguousarray(raw, RAW[dt]).tobytes())


# ------------------------------------------------------------------ formats
def fp8_table(ebits, mbits, bias, ieee):
    """All 256 codes decoded from sign, exponent and mantissa (float64)."""
    out = np.empty(256)
    top = (1 << ebits) - 1
    for code in range(256):
        s, e, m = code >> 7, (code >> mbits) & top, code & ((1 << mbits) - 1)
        if ieee and e == top:  # E5M2: IEEE infinities and NaNs
            v = math.inf if m == 0 else math.nan
        elif not ieee and e == top and m == (1 << mbits) - 1:  # E4M3: S.1111.111 only
            v = math.nan
        elif e == 0:  # subnormal
            v = m * 2.0 ** (1 - bias - mbits)
        else:
            v = (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias)
        out[code] = math.copysign(v, -1.0 if s else 1.0)
    return out


E4M3, E5M2 = fp8_table(4, 3, 7, False), fp8_table(5, 2, 15, True)
# (exponent bits, mantissa bits, bias, has inf)
FORMAT = {"F16": (5, 10, 15, True), "BF16": (8, 7, 127, True),
          "F8_E4M3": (4, 3, 7, False), "F8_E5M2": (5, 2, 15, True)}


def decode(dt, raw):
    """Raw codes -> float64 values (exact for every format)."""
    if dt == "F32":
        return raw.view("<f4").astype(np.float64)
    if dt == "F16":
        return raw.view("<f2").astype(np.float64)
    if dt == "BF16":
        return (raw.astype("<u4") << 16).view("<f4").astype(np.float64)
    return (E4M3 if dt == "F8_E4M3" else E5M2)[raw]


def to_bf16(x):
    """float32 -> bfloat16 bits, round to nearest even on the uint32 bits."""
    u = np.asarray(x, "<f4").view("<u4").astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r[nan] = (u[nan] >> 16) | 0x40  # quiet, same sign
    return r.astype("<u2")


def to_f16(x):
    return np.asarray(x, "<f4").astype("<f2").view("<u2")  # numpy rounds to nearest even


# ------------------------------------------------------------- the formula
def narrow_values(dt):
    ebits, mbits, bias, has_inf = FORMAT[dt]
    s, n = 2.0 ** (1 - bias - mbits), 2.0 ** (1 - bias)
    emax = (1 << ebits) - 2 - bias if has_inf else (1 << ebits) - 1 - bias
    big = (2 - 2.0 ** -mbits) * 2.0 ** emax if has_inf else (2 - 2.0 ** (1 - mbits)) * 2.0 ** emax
    v = [(i - 7) * 0.25 for i in range(16)] + [-0.0, s, -s, 3 * s, n, -1.5 * n, big, -big]
    return np.array(v + ([math.inf, -math.inf] if has_inf else []) + [math.nan])


def h(count):
    return (np.arange(count, dtype=np.uint64) * 2654435761) & 0xFFFFFFFF


def rne_src():
    x, i = h(4096), np.arange(4096)
    low = np.choose(i % 4, [x & 0xFFFF, 0x8000, 0x7FFF, 0x8001]).astype(np.uint64)
    return ((x & 0xFFFF0000) | low).astype("<u4").view("<f4")


def rne_f16_src():
    x, i = h(4096), np.arange(4096)
    low = np.choose(i % 4, [x & 0x1FFF, 0x1000, 0x0FFF, 0x1001]).astype(np.uint64)
    bits = (x & 0x80000000) | ((103 + (x >> 24) % 41) << 23) | (x & 0x7FE000) | low
    return bits.astype("<u4").view("<f4")


def formula():
    """{name: (dtype, shape, float64 values)} shared by both directions."""
    f = {"f32": ("F32", [4, 6], (np.arange(24) - 7) * 0.375),
         "f32_special": ("F32", [9], np.array([-0.0, 2.0 ** -149, -2.0 ** -149, 2.0 ** -126,
                                               float(np.finfo("<f4").max),
                                               -float(np.finfo("<f4").max),
                                               math.inf, -math.inf, math.nan])),
         "rne_src": ("F32", [4096], rne_src().astype(np.float64)),
         "rne_f16_src": ("F32", [4096], rne_f16_src().astype(np.float64))}
    for name, dt in (("f16", "F16"), ("bf16", "BF16"), ("e4m3", "F8_E4M3"), ("e5m2", "F8_E5M2")):
        v = narrow_values(dt)
        f[name] = (dt, [v.size], v)
    return f


# ------------------------------------------------------------------- checks
def same(what, got, want):
    """Equal as numbers, with the sign of zeros and NaNs."""
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    if got.shape != want.shape:
        raise Failed(f"{what}: {got.size} values, expected {want.size}")
    ok = ((got == want) | (np.isnan(got) & np.isnan(want))) & (np.signbit(got) == np.signbit(want))
    if not ok.all():
        bad = np.flatnonzero(~ok)
        rows = ", ".join(f"[{k}] {got[k]!r} != {want[k]!r}" for k in bad[:5])
        raise Failed(f"{what}: {bad.size} of {got.size} differ: {rows}")


def same_bits(what, got, want):
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    if got.shape != want.shape or not (got == want).all():
        bad = np.flatnonzero(got != want) if got.shape == want.shape else [0]
        raise Failed(f"{what}: {len(bad)} codes differ, first at {bad[0]}: "
                     f"{int(got[bad[0]]):#x} != {int(want[bad[0]]):#x}")


def get(tensors, name, dt, shape):
    if name not in tensors:
        raise Failed(f"missing tensor {name}")
    got_dt, got_shape, raw = tensors[name]
    if (got_dt, got_shape) != (dt, list(shape)):
        raise Failed(f"{name}: {got_dt} {got_shape}, expected {dt} {list(shape)}")
    return raw


def check_formula(path):
    t, meta = read(path)
    f = formula()
    names = set(f) | {"rne_bf16", "rne_f16"} | {
        k + s for k in ("e4m3", "e5m2", "f16", "bf16") for s in ("_codes", "_decoded")}
    if set(t) != names:
        raise Failed(f"{path}: tensors {sorted(set(t) ^ names)} missing or unexpected")
    for name, (dt, shape, want) in f.items():
        same(name, decode(dt, get(t, name, dt, shape)), want)
    src = rne_src()  # the rounding inputs bit for bit, NaN payloads included
    same_bits("rne_src bits", t["rne_src"][2], src.view("<u4"))
    same_bits("rne_f16_src bits", t["rne_f16_src"][2], rne_f16_src().view("<u4"))
    got = get(t, "rne_bf16", "BF16", [4096])
    want = to_bf16(src)
    nan = np.isnan(src)  # NaN: any NaN with the same sign
    same("rne_bf16 (NaNs)", decode("BF16", got[nan]), decode("BF16", want[nan]))
    same_bits("rne_bf16", got[~nan], want[~nan])
    same_bits("rne_f16", get(t, "rne_f16", "F16", [4096]), to_f16(rne_f16_src()))
    for name, dt, count in (("e4m3", "F8_E4M3", 256), ("e5m2", "F8_E5M2", 256),
                            ("f16", "F16", 65536), ("bf16", "BF16", 65536)):
        codes = get(t, name + "_codes", dt, [count])
        same_bits(name + "_codes", codes, np.arange(count))
        same(name + "_decoded", decode("F32", get(t, name + "_decoded", "F32", [count])),
             decode(dt, np.arange(count, dtype=RAW[dt])))
    want_meta = {"interop.formula": "1", "interop.text": TEXT}
    if meta != want_meta:
        raise Failed(f"metadata {meta!r}, expected {want_meta!r}")
    print(f"st_numpy.py: {path}: {len(t)} tensors match the formula")


def forward(config, weights, x):
    """float64 forward pass and an error bound for mixprec's float32 one.

    A Dense output computed in float32 (any order, FMA or not) from inputs
    off by at most e is within  |W|^T e + gamma(k+1) (|x|^T |W| + |b|)  of
    the exact value, gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, 3.1);
    relu and linear keep the bound. Softmax computes exp(z - max) in float32
    (glibc expf: < 1 ulp), sums in double, scales by a float32 reciprocal:
    a logit error d changes p by a factor within exp(+-2d), and the float32
    steps add at most (4 + |z - max|) u relative. The comparison allows
    twice the bound (slack for the reasoning, not for bugs)."""
    layers = {l["name"]: l for l in config["layers"]}
    val, err = {}, {}
    for l in config["layers"]:
        kind, name = l["class_name"], l["name"]
        if kind == "InputLayer":
            if list(l["shape"]) != [x.shape[1]]:
                raise Failed(f"input {name}: shape {l['shape']}, inputs have {x.shape[1]}")
            val[name], err[name] = x, np.zeros_like(x)
            continue
        (src,) = l["inputs"]
        a, e = val[src], err[src]
        if kind == "Dense":
            w, b = weights[name + ".kernel"], weights[name + ".bias"]
            k = w.shape[0]
            g = (k + 1) * U / (1 - (k + 1) * U)
            z = a @ w + b
            e = e @ np.abs(w) + g * (np.abs(a) @ np.abs(w) + np.abs(b))
            a = z
        elif kind != "Activation":
            raise Failed(f"layer {name}: {kind} is not supported by this check")
        act = l["activation"]
        if act == "relu":
            a = np.maximum(a, 0)
        elif act == "softmax":
            d = e.max(axis=1, keepdims=True)
            span = a.max(axis=1, keepdims=True) - a
            a = np.exp(-span)
            a = a / a.sum(axis=1, keepdims=True)
            e = a * (np.expm1(2 * d) + (4 + span) * U)
        elif act != "linear":
            raise Failed(f"layer {name}: activation {act} is not supported by this check")
        val[name], err[name] = a, e
    out = config["output"]
    if out not in layers:
        raise Failed(f"output {out} is not a layer")
    return val[out], err[out]


def check_model(ckpt, pred_path):
    t, meta = read(ckpt)
    config = json.loads(meta["mixprec.config"])
    training = json.loads(meta["mixprec.training"])
    if config.get("format") != "mixprec.model" or meta.get("format") != "pt":
        raise Failed(f"{ckpt}: not a mixprec checkpoint")
    weights, units = {}, {}
    for l in config["layers"]:
        if l["class_name"] == "InputLayer":
            units[l["name"]] = int(np.prod(l["shape"]))
            continue
        (src,) = l["inputs"]
        units[l["name"]] = units[src]
        if l["class_name"] == "Dense":
            k, n = units[src], l["units"]
            for p, shape in ((".kernel", [k, n]), (".bias", [n])):
                w = decode("F32", get(t, l["name"] + p, "F32", shape))
                if not np.isfinite(w).all():
                    raise Failed(f"{l['name'] + p}: non-finite values")
                weights[l["name"] + p] = w
            units[l["name"]] = n
    if not weights:
        raise Failed(f"{ckpt}: no Dense layer in mixprec.config")
    opt = training["compile"]["optimizer"]
    slots = {"adam": ["exp_avg", "exp_avg_sq"], "adamw": ["exp_avg", "exp_avg_sq"],
             "sgd": ["momentum_buffer"] if opt["momentum"] else []}[opt["kind"]]
    for p, w in weights.items():
        for s in slots:
            v = decode("F32", get(t, f"optimizer/{p}/{s}", "F32", w.shape))
            if not np.isfinite(v).all() or (s == "exp_avg_sq" and (v < 0).any()):
                raise Failed(f"optimizer/{p}/{s}: non-finite or negative values")
    expected = set(weights) | {f"optimizer/{p}/{s}" for p in weights for s in slots}
    if set(t) != expected:
        raise Failed(f"{ckpt}: unexpected tensors {sorted(set(t) ^ expected)}")
    steps = (training["optimizer_step"], training["steps_applied"], training["steps_skipped"])
    if steps != (TRAIN_STEPS, TRAIN_STEPS, 0):
        raise Failed(f"{ckpt}: step counts {steps}, expected ({TRAIN_STEPS}, {TRAIN_STEPS}, 0)")
    p, _ = read(pred_path)
    for name in ("inputs", "predictions"):
        if name not in p or p[name][0] != "F32" or len(p[name][1]) != 2:
            raise Failed(f"{pred_path}: needs a 2-D F32 tensor {name}")
    x, got = decode("F32", p["inputs"][2]), decode("F32", p["predictions"][2])
    want, bound = forward(config, weights, x)
    if got.shape != want.shape:
        raise Failed(f"predictions {list(got.shape)}, expected {list(want.shape)}")
    diff = np.abs(got - want)
    if not (diff <= 2 * bound).all():
        k = np.unravel_index(np.argmax(diff - 2 * bound), diff.shape)
        raise Failed(f"prediction {k}: {got[k]!r} vs float64 {want[k]!r} "
                     f"(difference {diff[k]:.3g} > allowed {2 * bound[k]:.3g})")
    print(f"st_numpy.py: {ckpt}: {len(weights)} weights, {len(slots)} optimizer slots each; "
          f"{got.shape[0]} predictions within float32 rounding (largest difference "
          f"{diff.max():.3g}, {np.max(diff / (2 * bound)):.2f} of the allowed)")


def write_formula(path):
    f = formula()
    enc = {"F32": lambda v: v.astype("<f4").view("<u4"), "F16": to_f16, "BF16": to_bf16}
    r, c = np.meshgrid(np.arange(4), np.arange(3), indexing="ij")
    f["dense.kernel"] = ("F32", [4, 3], (3 * r + c - 5) * 0.125)
    f["dense.bias"] = ("F32", [3], (np.arange(3) - 1) * 0.5)
    # Out of name order, and the float32 tensors after the 54 bytes of f16 sit
    # at offsets that are not multiples of 4: the format promises no alignment.
    tensors = []
    for name in ("f16", "dense.kernel", "dense.bias", "f32_special", "bf16", "f32"):
        dt, shape, v = f[name]
        tensors.append((name, dt, shape, enc[dt](v.astype("<f4")).reshape(shape)))
    tensors.append(("rne_bf16", "BF16", [4096], to_bf16(rne_src())))
    tensors.append(("rne_f16", "F16", [4096], to_f16(rne_f16_src())))
    write(path, tensors, {"format": "pt", "interop.formula": "1", "interop.text": TEXT})
    print(f"st_numpy.py: wrote {path}: {len(tensors)} tensors")


def main(argv):
    np.seterr(all="ignore")  # NaN payloads and overflow to inf are intended
    try:
        if len(argv) == 3 and argv[1] == "check":
            check_formula(argv[2])
        elif len(argv) == 4 and argv[1] == "check":
            check_model(argv[2], argv[3])
        elif len(argv) == 3 and argv[1] == "write":
            write_formula(argv[2])
        else:
            print("\n\n".join(__doc__.split("\n\n")[:2]), file=sys.stderr)
            return 2
    except Failed as e:
        print(f"st_numpy.py: FAILED: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"st_numpy.py: ERROR: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
