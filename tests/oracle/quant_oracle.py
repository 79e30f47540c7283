#!/usr/bin/env python3
"""Checks sluice's dequantization against the python gguf package (an independent implementation).

(a) random valid blocks of every format (raw random bytes, f16/f32 scale fields forced finite);
(b) every tensor of the real model, located with gguf.GGUFReader;
(c) the Q8_0 activation quantizer, byte for byte against gguf.quants.quantize (ggml's reference).

Dequantized values must agree within f32 rounding: |ours - theirs| <= 2^-20 * (|theirs| + the
block's largest |theirs|), exact for F32/F16/BF16 (NaNs must both be NaN). gguf has no Q8_1/Q8_K
code (activation-only formats); those are checked against a direct numpy transcription here.

Exit 0 when everything matches; 1 on any mismatch; the real-model part fails if the model is
missing while SLUICE_REQUIRE_MODELS is set, and is skipped (with a message) otherwise.
--corrupt perturbs one of sluice's values first, to prove the comparison can fail.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# name, ggml type id, elements per block, bytes per block, offsets of f16 fields, offsets of f32 fields
FORMATS = [
    ("f32", T.F32, 1, 4, [], [0]),
    ("f16", T.F16, 1, 2, [0], []),
    ("bf16", T.BF16, 1, 2, [], []),
    ("q4_0", T.Q4_0, 32, 18, [0], []),
    ("q4_1", T.Q4_1, 32, 20, [0, 2], []),
    ("q5_0", T.Q5_0, 32, 22, [0], []),
    ("q5_1", T.Q5_1, 32, 24, [0, 2], []),
    ("q8_0", T.Q8_0, 32, 34, [0], []),
    ("q8_1", T.Q8_1, 32, 36, [0, 2], []),
    ("q2_k", T.Q2_K, 256, 84, [80, 82], []),
    ("q3_k", T.Q3_K, 256, 110, [108], []),
    ("q4_k", T.Q4_K, 256, 144, [0, 2], []),
    ("q5_k", T.Q5_K, 256, 176, [0, 2], []),
    ("q6_k", T.Q6_K, 256, 210, [208], []),
    ("q8_k", T.Q8_K, 256, 292, [], [0]),
]
NAME_OF = {f[1]: f[0] for f in FORMATS}


def numpy_dequant(raw: np.ndarray, fmt) -> np.ndarray:
    """Q8_1 and Q8_K, which gguf does not implement: x = d * q."""
    name, _, qk, bb, _, _ = fmt
    b = raw.reshape(-1, bb)
    if name == "q8_1":
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = b[:, 4:36].copy().view(np.int8).astype(np.float32)
    else:
        d = b[:, 0:4].copy().view(np.float32)
        q = b[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def theirs(raw: np.ndarray, fmt) -> np.ndarray:
    if fmt[0] in ("q8_1", "q8_k"):
        return numpy_dequant(raw, fmt)
    return np.asarray(gguf.quants.dequantize(raw, fmt[1]), dtype=np.float32).reshape(-1)


def ours(dump, fmt, n, path, offset, tmp, corrupt):
    out = os.path.join(tmp, "out.f32")
    subprocess.run([dump, "dequant", fmt[0], str(n), path, str(offset), out], check=True)
    v = np.fromfile(out, dtype=np.float32)
    if corrupt:
        v = v.copy()
        v[len(v) // 2] = v[len(v) // 2] * 1.001 + 1e-3
    return v


def compare(label, a, b, fmt) -> bool:
    if a.shape != b.shape:
        print(f"FAIL {label}: {a.shape} values vs {b.shape}")
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        print(f"FAIL {label}: NaN positions differ")
        return False
    a, b = np.where(nan_a, 0, a), np.where(nan_b, 0, b)
    if fmt[2] == 1:
        bad = a != b
    else:
        ab = np.abs(b.astype(np.float64)).reshape(-1, fmt[2])
        tol = 2.0**-20 * (ab + ab.max(axis=1, keepdims=True))
        bad = (np.abs(a.astype(np.float64) - b.astype(np.float64)).reshape(-1, fmt[2]) > tol).reshape(-1)
    if bad.any():
        i = int(np.argmax(bad))
        print(f"FAIL {label}: {int(bad.sum())} of {a.size} values differ; first at {i}: sluice {a[i]!r} gguf {b[i]!r}")
        return False
    return True


def random_blocks(fmt, nblocks, rng) -> np.ndarray:
    name, _, qk, bb, f16s, f32s = fmt
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for off in f16s:  # finite f16 of either sign, magnitudes spread over many binades
        v = (rng.standard_normal(nblocks) * np.exp2(rng.integers(-14, 8, nblocks))).astype(np.float16)
        raw[:, off:off + 2] = v.reshape(-1, 1).view(np.uint8)
    for off in f32s:
        v = (rng.standard_normal(nblocks) * np.exp2(rng.integers(-30, 30, nblocks))).astype(np.float32)
        raw[:, off:off + 4] = v.reshape(-1, 1).view(np.uint8)
    return raw.reshape(-1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--corrupt", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (replay with --seed {seed})")
    rng = np.random.default_rng(seed)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        # (a) random valid blocks
        for fmt in FORMATS:
            nblocks = 4096 if fmt[2] == 1 else 256
            raw = random_blocks(fmt, nblocks, rng)
            path = os.path.join(tmp, "in.bin")
            pad = 7  # a non-zero offset exercises the offset argument
            with open(path, "wb") as f:
                f.write(b"\0" * pad + raw.tobytes())
            n = nblocks * fmt[2]
            good = compare(f"random {fmt[0]}", ours(args.dump, fmt, n, path, pad, tmp, args.corrupt), theirs(raw, fmt), fmt)
            print(f"{'ok  ' if good else 'FAIL'} random blocks {fmt[0]}: {n} values")
            ok &= good

        # (c) Q8_0 activation quantizer, byte-exact against ggml's reference as gguf implements it
        x = (rng.standard_normal(32 * 512) * np.exp2(rng.integers(-8, 8, 32 * 512))).astype(np.float32)
        x[:32] = 0  # an all-zero block
        xin, qout = os.path.join(tmp, "x.f32"), os.path.join(tmp, "q.bin")
        x.tofile(xin)
        subprocess.run([args.dump, "quantize", "q8_0", str(x.size), xin, qout], check=True)
        mine = np.fromfile(qout, dtype=np.uint8)
        if args.corrupt:
            mine[5] ^= 1
        ref = np.asarray(gguf.quants.quantize(x, T.Q8_0)).reshape(-1)
        same = np.array_equal(mine, ref)
        print(f"{'ok  ' if same else 'FAIL'} q8_0 quantize byte-exact vs gguf.quants.quantize ({x.size} values)")
        ok &= same

        # (b) every tensor of the real model
        if not os.path.exists(args.model):
            if os.environ.get("SLUICE_REQUIRE_MODELS"):
                print(f"FAIL model missing: {args.model} (SLUICE_REQUIRE_MODELS is set)")
                return 1
            print(f"skipped real-model check: {args.model} not installed (run scripts/fetch-models.sh)")
        else:
            reader = gguf.GGUFReader(args.model)
            count = 0
            fmts = {f[1]: f for f in FORMATS}
            for t in reader.tensors:
                fmt = fmts.get(t.tensor_type)
                if fmt is None:
                    print(f"FAIL {t.name}: type {t.tensor_type!r} unsupported by sluice")
                    ok = False
                    continue
                n = int(t.n_elements)
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                a = ours(args.dump, fmt, n, args.model, int(t.data_offset), tmp, args.corrupt and count == 0)
                good = compare(f"{t.name} ({fmt[0]})", a, theirs(raw, fmt), fmt)
                ok &= good
                count += 1
            print(f"{'ok  ' if ok else 'FAIL'} real model: {count} tensors of {os.path.basename(args.model)}")
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
