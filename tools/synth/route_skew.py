#!/usr/bin/env python3
"""Measures the expert popularity of a `sluice synth` MoE file's routers against the Zipf target.

Reads the file with the python gguf package (an implementation independent of sluice), takes
token_embd rows as the routers' inputs (RMS-normalized and scaled by ffn_norm, as the model does)
and routes them as llama.cpp does (softmax over all experts, then top-k; top-k of the logits is
the same selection). For a --route-skew file this is exact in every layer: no layer writes the
reserved dims the routers read (RouteSkew in src/app/synth.h), and the rest of the residual
stream only changes the positive per-token RMS factor. For an S = 0 file it approximates layer 0
(attention's contribution is left out) and deeper layers less.

  route_skew.py FILE [--skew S] [--layers 0,1|all] [--tokens N]
                [--min-top-over-median R] [--max-top-over-median R] [--max-log-error E]
                [--llama-routes ROUTES.txt]

The --min/--max/--max-log-error options make it a check: exit 1 when a layer misses them.
--llama-routes takes what tools/synth/llama_routes.cpp recorded from llama.cpp's own forward pass
(random sequences: every position, with attention) and reports, per layer, how often llama.cpp
selected exactly the predicted experts, and the popularity it measured.
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def zipf_targets(n_expert, n_used, s):
    """Share of top-k selections per popularity rank: r^-s normalized, capped at 1/k (water-filling)."""
    p = np.arange(1, n_expert + 1, dtype=np.float64) ** -s
    cap = 1.0 / n_used
    capped = np.zeros(n_expert, dtype=bool)
    for _ in range(n_expert + 1):
        free = p[~capped].sum()
        p[~capped] *= (1.0 - cap * capped.sum()) / free if free > 0 else 0.0
        new = (~capped) & (p > cap * (1 + 1e-12))
        capped |= new
        p[capped] = cap
        if not new.any():
            break
    return p


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--skew", type=float, help="Zipf exponent to compare with (default: the file's sluice.synth.route_skew, else 0)")
    ap.add_argument("--layers", default="0", help="comma-separated layers or 'all' (default 0)")
    ap.add_argument("--tokens", type=int, default=20000, help="token_embd rows to route (default 20000; all if fewer)")
    ap.add_argument("--min-top-over-median", type=float)
    ap.add_argument("--max-top-over-median", type=float)
    ap.add_argument("--llama-routes", help="routes recorded by tools/synth/llama_routes.cpp")
    ap.add_argument("--max-log-error", type=float,
                    help="largest |ln(measured/target)| allowed over the ranks whose target is >= 1/(4 x experts)")
    args = ap.parse_args()

    r = GGUFReader(args.file)
    arch = field(r, "general.architecture")
    n_layer = field(r, f"{arch}.block_count")
    n_expert = field(r, f"{arch}.expert_count", 0)
    n_used = field(r, f"{arch}.expert_used_count", 0)
    eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    s = args.skew if args.skew is not None else field(r, "sluice.synth.route_skew", 0.0)
    if not n_expert:
        sys.exit(f"{args.file}: not a mixture-of-experts file")
    tensors = {t.name: t for t in r.tensors}

    embd_t = tensors["token_embd.weight"]
    vocab = int(embd_t.shape[1])
    rng = np.random.default_rng(0)
    rows = np.arange(vocab) if vocab <= args.tokens else np.sort(rng.choice(vocab, args.tokens, replace=False))
    embd = dequantize(embd_t.data, embd_t.tensor_type).reshape(vocab, -1)[rows].astype(np.float64)
    x_hat = embd / np.sqrt(np.mean(embd * embd, axis=1, keepdims=True) + eps)

    layers = range(n_layer) if args.layers == "all" else [int(v) for v in args.layers.split(",")]
    target = zipf_targets(n_expert, n_used, s)
    print(f"{args.file}: {arch}, {n_expert} experts, top-{n_used}, S = {s:g}, {len(rows)} tokens")
    ranks = [rk for rk in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512) if rk <= n_expert]
    if n_expert not in ranks:
        ranks.append(n_expert)
    ok = True
    top_experts = []
    for l in layers:
        g = np.asarray(tensors[f"blk.{l}.ffn_norm.weight"].data, dtype=np.float64)
        w = np.asarray(tensors[f"blk.{l}.ffn_gate_inp.weight"].data, dtype=np.float64).reshape(n_expert, -1)
        logits = (x_hat * g) @ w.T
        sel = np.argpartition(-logits, n_used - 1, axis=1)[:, :n_used]
        counts = np.bincount(sel.ravel(), minlength=n_expert)
        order = np.argsort(-counts, kind="stable")
        share = counts[order] / counts.sum()
        top_experts.append(int(order[0]))
        median = float(np.median(counts))
        ratio = counts[order[0]] / max(median, 1e-9)
        sig = target >= 1.0 / (4 * n_expert)
        log_err = np.abs(np.log(np.maximum(share, 1e-12) / target))[sig].max()
        print(f"layer {l}: most popular expert {order[0]}, top/median {ratio:.2f}, "
              f"max |ln(measured/target)| {log_err:.3f} over {int(sig.sum())} ranks")
        if l == layers[0] or args.layers != "all":
            print("   rank  expert  measured  target")
            for rk in ranks:
                print(f"   {rk:4d}  {order[rk - 1]:6d}  {share[rk - 1]:8.4f}  {target[rk - 1]:6.4f}")
        if args.min_top_over_median is not None and ratio < args.min_top_over_median:
            print(f"FAIL layer {l}: top/median {ratio:.2f} < {args.min_top_over_median}")
            ok = False
        if args.max_top_over_median is not None and ratio > args.max_top_over_median:
            print(f"FAIL layer {l}: top/median {ratio:.2f} > {args.max_top_over_median}")
            ok = False
        if args.max_log_error is not None and log_err > args.max_log_error:
            print(f"FAIL layer {l}: max |ln(measured/target)| {log_err:.3f} > {args.max_log_error}")
            ok = False
    if args.llama_routes:
        rec = np.loadtxt(args.llama_routes, dtype=np.int64, ndmin=2)
        embd_all = dequantize(embd_t.data, embd_t.tensor_type).reshape(vocab, -1).astype(np.float64)
        print(f"llama.cpp's selections ({args.llama_routes}): exact = the predicted top-{n_used} set")
        for l in sorted(set(rec[:, 1].tolist())):
            rl = rec[rec[:, 1] == l]
            e = embd_all[rl[:, 0]]
            x = e / np.sqrt(np.mean(e * e, axis=1, keepdims=True) + eps)
            g = np.asarray(tensors[f"blk.{l}.ffn_norm.weight"].data, dtype=np.float64)
            w = np.asarray(tensors[f"blk.{l}.ffn_gate_inp.weight"].data, dtype=np.float64).reshape(n_expert, -1)
            pred = np.sort(np.argpartition(-((x * g) @ w.T), n_used - 1, axis=1)[:, :n_used], axis=1)
            exact = np.mean(np.all(pred == np.sort(rl[:, 2:], axis=1), axis=1))
            counts = np.bincount(rl[:, 2:].ravel(), minlength=n_expert)
            share = np.sort(counts)[::-1] / counts.sum()
            print(f"layer {l}: {len(rl)} positions, exact {exact:.3f}, "
                  f"top/median {counts.max() / max(float(np.median(counts)), 1e-9):.2f}, top-4 shares "
                  f"{' '.join(f'{v:.3f}' for v in share[:4])} (target {' '.join(f'{v:.3f}' for v in target[:4])})")
    if len(top_experts) > 1:
        print(f"most popular expert per layer: {top_experts} ({len(set(top_experts))} distinct)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
