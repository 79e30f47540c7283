#!/usr/bin/env python3
"""Expert popularity PNG from a sluice access trace of a mixture-of-experts run (--trace FILE).

Reads the "expert" rows (one per expert use: layer, tensor "blk.L.exp.E.pass.P", tier; format in
docs/STREAMING.md) and draws
  - a heatmap of uses per (layer, expert), experts of each layer sorted by popularity when
    --sort is given (the shape of the skew) or in id order (which experts);
  - the hit rate a frequency-then-recency cache (the engine's eviction rule) would have had on this
    trace's access sequence, for cache sizes from one layer's experts to all of them, next to the
    hit rate measured in the run (the trace's tiers) at the cache size given with --cache-slots.

    python3 bench/plot/experts.py trace.csv -o experts.png [--sort] [--cache-slots N] [--decode-only]

Exit 2 on a malformed trace or one without expert rows.
"""
import argparse
import csv
import re
import sys

COLUMNS = ["t_start_us", "t_end_us", "lane", "layer", "tensor", "tier", "bytes"]
EXPERT = re.compile(r"^blk\.(\d+)\.exp\.(\d+)\.pass\.(\d+)$")
HIT_TIERS = {"ram hit", "vram hit", "prefetch"}


def read_uses(path):
    """[(pass, layer, expert, tier)] in trace order."""
    uses = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != COLUMNS:
            raise ValueError(f"{path}: header is {header}, expected {','.join(COLUMNS)}")
        for n, r in enumerate(reader, start=2):
            if len(r) != len(COLUMNS):
                raise ValueError(f"{path}:{n}: {len(r)} fields, expected {len(COLUMNS)}")
            if r[2] != "expert":
                continue
            m = EXPERT.match(r[4])
            if not m:
                raise ValueError(f"{path}:{n}: expert row names '{r[4]}', expected blk.L.exp.E.pass.P")
            layer, expert, p = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if layer != int(r[3]):
                raise ValueError(f"{path}:{n}: layer column {r[3]} differs from the name's {layer}")
            uses.append((p, layer, expert, r[5]))
    return uses


def simulate(uses, slots):
    """Hit rate of a cache of `slots` experts with the engine's rule: on a miss evict the expert with
    the fewest uses so far, then the least recently used, never one of the layer being placed."""
    freq, last, cached = {}, {}, set()
    hits = 0
    stamp = 0
    prev = None
    for p, layer, expert, _ in uses:
        if (p, layer) != prev:
            stamp += 1
            prev = (p, layer)
            busy = set()
        key = (layer, expert)
        freq[key] = freq.get(key, 0) + 1
        last[key] = stamp
        busy.add(key)
        if key in cached:
            hits += 1
            continue
        if len(cached) >= slots:
            candidates = [k for k in cached if k not in busy]
            if not candidates:
                continue  # the engine places such a layer in groups; count it as a miss
            victim = min(candidates, key=lambda k: (freq[k], last[k]))
            cached.remove(victim)
        cached.add(key)
    return hits / max(len(uses), 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", default="experts.png")
    ap.add_argument("--sort", action="store_true", help="sort each layer's experts by popularity")
    ap.add_argument("--cache-slots", type=int, default=None, help="the run's cache size (experts), marked on the curve")
    ap.add_argument("--decode-only", action="store_true",
                    help="only passes where every layer used at most as many experts as in the smallest pass")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    try:
        uses = read_uses(args.trace)
    except (OSError, ValueError) as e:
        print(f"experts: {e}", file=sys.stderr)
        return 2
    if args.decode_only and uses:
        per_pass = {}
        for p, layer, _, _ in uses:
            per_pass[(p, layer)] = per_pass.get((p, layer), 0) + 1
        smallest = min(per_pass.values())
        uses = [u for u in uses if per_pass[(u[0], u[1])] <= smallest]
    if not uses:
        print("experts: no expert rows in the trace (a MoE run with --trace and --ram-budget or --vram-budget)",
              file=sys.stderr)
        return 2

    n_layer = max(u[1] for u in uses) + 1
    n_expert = max(u[2] for u in uses) + 1
    counts = [[0] * n_expert for _ in range(n_layer)]
    for _, layer, expert, _ in uses:
        counts[layer][expert] += 1
    if args.sort:
        counts = [sorted(row, reverse=True) for row in counts]
    measured = sum(1 for u in uses if u[3] in HIT_TIERS) / len(uses)

    total = n_layer * n_expert
    sizes = sorted({max(1, round(total * f)) for f in (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)})
    if args.cache_slots:
        sizes = sorted(set(sizes) | {args.cache_slots})
    curve = [(s, simulate(uses, s)) for s in sizes]

    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    im = a0.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    a0.set_xlabel("expert rank in its layer" if args.sort else "expert")
    a0.set_ylabel("layer")
    a0.set_title(f"uses per expert ({len(uses)} uses, {n_layer} layers x {n_expert} experts)")
    fig.colorbar(im, ax=a0, label="uses")
    a1.plot([100 * s / total for s, _ in curve], [100 * h for _, h in curve], marker="o",
            label="frequency/recency cache, simulated")
    if args.cache_slots:
        a1.scatter([100 * args.cache_slots / total], [100 * measured], color="red", zorder=3,
                   label=f"measured in the run ({args.cache_slots} slots)")
    a1.set_xlabel("cache size (% of all experts)")
    a1.set_ylabel("hit rate (%)")
    a1.set_ylim(0, 100)
    a1.grid(alpha=0.3)
    a1.legend(fontsize="small", loc="lower right")
    a1.set_title("hit rate vs cache size")
    fig.suptitle(args.title or args.trace)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"experts: {len(uses)} uses, {n_layer} layers x {n_expert} experts, measured hit rate "
          f"{100 * measured:.1f}%; simulated: " + ", ".join(f"{s}: {100 * h:.1f}%" for s, h in curve)
          + f" -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
