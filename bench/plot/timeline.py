#!/usr/bin/env python3
"""Timeline PNG from a sluice access trace (--trace FILE; format in docs/STREAMING.md).

One horizontal lane per trace lane (load, disk slot K, h2d slot K, stall, cpu, gpu, ...), x = time
in milliseconds; each row of the trace is one bar. Bars are coloured by the tier the bytes came
from, and alternate in shade by layer so neighbouring layers stay distinguishable.

    python3 bench/plot/timeline.py trace.csv -o timeline.png [--from-ms A] [--to-ms B]
"""
import argparse
import csv
import re
import sys

COLUMNS = ["t_start_us", "t_end_us", "lane", "layer", "tensor", "tier", "bytes"]
TIER_COLOURS = {"disk": ("#d9822b", "#f0b27a"), "ram": ("#2b7bd9", "#7aaef0"), "vram": ("#2ba84a", "#7ad68f")}
LANE_ORDER = ["load", "disk", "h2d", "stall", "cpu", "gpu"]


def read_trace(path):
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != COLUMNS:
            raise ValueError(f"{path}: header is {header}, expected {','.join(COLUMNS)}")
        rows = []
        for n, r in enumerate(reader, start=2):
            if len(r) != len(COLUMNS):
                raise ValueError(f"{path}:{n}: {len(r)} fields, expected {len(COLUMNS)}")
            start, end = int(r[0]), int(r[1])
            if end < start:
                raise ValueError(f"{path}:{n}: t_end_us {end} before t_start_us {start}")
            rows.append({"start": start, "end": end, "lane": r[2], "layer": int(r[3]), "tensor": r[4],
                         "tier": r[5], "bytes": int(r[6])})
    return rows


def lane_key(lane):
    """Known lane families in pipeline order, numbered lanes by number, the rest after."""
    m = re.match(r"(.*?)\s*(\d+)$", lane)
    base, num = (m.group(1), int(m.group(2))) if m else (lane, -1)
    family = base.split()[0] if base else base
    rank = LANE_ORDER.index(family) if family in LANE_ORDER else len(LANE_ORDER)
    return (rank, base, num)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", default="timeline.png")
    ap.add_argument("--from-ms", type=float, default=None, help="window start (default: first event)")
    ap.add_argument("--to-ms", type=float, default=None, help="window end (default: last event)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)

    try:
        rows = read_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"timeline: {e}", file=sys.stderr)
        return 2
    lo = args.from_ms * 1e3 if args.from_ms is not None else None
    hi = args.to_ms * 1e3 if args.to_ms is not None else None
    rows = [r for r in rows if (lo is None or r["end"] >= lo) and (hi is None or r["start"] <= hi)]
    if not rows:
        print("timeline: no events in the window", file=sys.stderr)
        return 2

    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = sorted({r["lane"] for r in rows}, key=lane_key)
    y = {lane: i for i, lane in enumerate(reversed(lanes))}
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.45 * len(lanes)))
    for lane in lanes:
        bars, colours = [], []
        for r in rows:
            if r["lane"] != lane:
                continue
            # A zero-length event still shows as a hairline.
            bars.append((r["start"] / 1e3, max(r["end"] - r["start"], 1) / 1e3))
            pair = TIER_COLOURS.get(r["tier"], ("#777777", "#bbbbbb"))
            colours.append(pair[r["layer"] % 2] if r["layer"] >= 0 else pair[0])
        ax.broken_barh(bars, (y[lane] - 0.4, 0.8), facecolors=colours, edgecolor="none")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(list(reversed(lanes)))
    ax.set_xlabel("time (ms)")
    if lo is not None or hi is not None:
        ax.set_xlim(left=lo / 1e3 if lo is not None else None, right=hi / 1e3 if hi is not None else None)
    total = sum(r["bytes"] for r in rows if r["lane"].startswith("disk"))
    ax.set_title(args.title or f"{args.trace}: {len(rows)} events, {total / 1e6:.1f} MB read from disk")
    tiers = sorted({r["tier"] for r in rows})
    ax.legend(handles=[Patch(color=TIER_COLOURS.get(t, ("#777777",))[0], label=t) for t in tiers],
              loc="upper right", fontsize="small", title="tier")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"timeline: {len(rows)} events in {len(lanes)} lanes -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
