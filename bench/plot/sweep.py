#!/usr/bin/env python3
"""Decode tok/s against free GPU memory from bench/e2e/hybrid_sweep.sh's CSV: sluice hybrid,
sluice pure streaming, llama.cpp's best -ngl at each point, and the bound of sluice's placement.

    python3 bench/plot/sweep.py SWEEP.csv -o sweep.png [--title TEXT]

Prints the table it plots (markdown) with the ratios. Exit 2 on a malformed file."""
import argparse
import csv
import sys
from collections import defaultdict


def load(path):
    rows = defaultdict(dict)  # free -> series -> value
    try:
        with open(path, newline="") as f:
            r = csv.DictReader(f)
            need = {"free_gib", "engine", "config", "tok_s", "bound_tok_s"}
            if not r.fieldnames or not need <= set(r.fieldnames):
                raise ValueError("header must hold " + ", ".join(sorted(need)))
            for row in r:
                free = float(row["free_gib"])
                if not row["tok_s"]:
                    continue
                v = float(row["tok_s"])
                if row["engine"] == "llama.cpp":
                    best = rows[free].get("llama.cpp")
                    if best is None or v > best[0]:
                        rows[free]["llama.cpp"] = (v, row["config"])
                else:
                    rows[free]["sluice " + row["config"]] = (v, row["config"])
                    if row["config"] == "hybrid" and row["bound_tok_s"]:
                        rows[free]["bound"] = (float(row["bound_tok_s"]), "")
    except (OSError, ValueError, KeyError) as e:
        print(f"sweep.py: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if not rows:
        print(f"sweep.py: {path}: no rows", file=sys.stderr)
        sys.exit(2)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--title", default="70B Q4_K_M decode vs free GPU memory")
    a = ap.parse_args()
    rows = load(a.csv)
    xs = sorted(rows)
    print("| free VRAM | sluice hybrid | sluice pure streaming | llama.cpp best -ngl | hybrid / llama.cpp | hybrid / pure | bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for x in xs:
        r = rows[x]
        h, p, l, b = (r.get(k, (None, ""))[0] for k in ("sluice hybrid", "sluice pure", "llama.cpp", "bound"))
        f = lambda v: "-" if v is None else f"{v:.2f}"
        ratio = lambda n, d: "-" if n is None or not d else f"{n / d:.2f}x"
        ngl = r.get("llama.cpp", (None, ""))[1].replace("ngl ", "")
        print(f"| {x:g} GiB | {f(h)} | {f(p)} | {f(l)}{f' (-ngl {ngl})' if ngl else ''} | {ratio(h, l)} | {ratio(h, p)} | {f(b)} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sweep.py: matplotlib not installed: table only", file=sys.stderr)
        sys.exit(77)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=130)
    for key, style in (("bound", "k:"), ("sluice hybrid", "o-"), ("sluice pure", "s--"), ("llama.cpp", "^-")):
        pts = [(x, rows[x][key][0]) for x in xs if key in rows[x]]
        if pts:
            label = {"bound": "bound (sluice's placement)", "sluice pure": "sluice pure streaming",
                     "llama.cpp": "llama.cpp best -ngl"}.get(key, key)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xlabel("free GPU memory (GiB)")
    ax.set_ylabel("decode tok/s (batch 1)")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.output)


if __name__ == "__main__":
    main()
