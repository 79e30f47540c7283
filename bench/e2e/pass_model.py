#!/usr/bin/env python3
"""A discrete-event model of one streamed multi-token pass with hybrid placement (docs/SERVING.md):
the time of a pass for each ring slot count and CPU layer count, run as today (the whole batch
layer after layer) and as two micro-batches in flight (the CPU on one half's layer while the GPU
runs the other half's layers). Prints, per mode and slot count, the fastest CPU layer count.

Per-layer times default to a 70B Q4_K_M 32-token pass on the H200 host (trace of 2026-11-28 and
the stop-40 serve runs): a CPU layer 26 ms, a slot copy 9.4 ms, a GPU layer 0.9 ms (0.55 ms for a
16-token half), a hand-off 0.15 ms, a 16-token CPU half 1.07x half of a 32-token layer. VRAM holds
`--vram-layers` layers in all: resident ones plus the slots. Placement: resident layers first, the
CPU layers spread evenly over the others, the rest copied through the ring in order; a slot is
free again once every half has run its layer. The host issues GPU work as soon as its input and
slot are ready (the leading half first) and computes on the CPU the half that is furthest behind.

    python3 bench/e2e/pass_model.py [--layers 80] [--vram-layers 23] [--cpu-ms 26] ...
"""

import argparse


def placement(n_layers, resident, cpu):
    kinds = ["r"] * resident + ["s"] * (n_layers - resident)
    rest = [i for i in range(n_layers) if kinds[i] == "s"]
    if cpu:
        step = len(rest) / cpu
        for j in range(cpu):
            kinds[rest[int(j * step + step / 2)]] = "c"
    return kinds


def simulate(kinds, slots, halves, a):
    """Pass time in ms; None if the schedule cannot proceed."""
    n = len(kinds)
    t_cpu = a.cpu_ms / 2 * a.half_cpu_factor if halves == 2 else a.cpu_ms
    t_gpu = a.gpu_half_ms if halves == 2 else a.gpu_ms
    streamed = [i for i in range(n) if kinds[i] == "s"]
    index = {l: j for j, l in enumerate(streamed)}
    copy_end, released, used = {}, {}, {}
    engine = [0.0]

    def copied(layer):  # when the layer's copy ends; None while its slot is still held
        if layer in copy_end:
            return copy_end[layer]
        j = index[layer]
        if j > 0 and copied(streamed[j - 1]) is None:
            return None
        start = engine[0]
        if j >= slots:
            prev = streamed[j - slots]
            if prev not in released:
                return None
            start = max(start, released[prev])
        copy_end[layer] = engine[0] = start + a.copy_ms
        return copy_end[layer]

    gpu = cpu = 0.0
    ready = [0.0] * halves
    pos = [0] * halves
    while any(p < n for p in pos):
        moved = False
        for h in sorted(range(halves), key=lambda h: (-pos[h], h)):  # the leading half first
            while pos[h] < n and kinds[pos[h]] != "c":
                layer = pos[h]
                at = copied(layer) if kinds[layer] == "s" else 0.0
                if at is None:
                    break
                gpu = max(gpu, ready[h], at) + t_gpu
                nxt = layer + 1
                ready[h] = gpu + (a.handoff_ms if nxt < n and kinds[nxt] == "c" else 0.0)
                if kinds[layer] == "s":
                    used.setdefault(layer, set()).add(h)
                    if len(used[layer]) == halves:
                        released[layer] = gpu
                pos[h] += 1
                moved = True
        waiting = [h for h in range(halves) if pos[h] < n and kinds[pos[h]] == "c"]
        if waiting:
            h = min(waiting, key=lambda h: (pos[h], h))
            cpu = max(cpu, ready[h]) + t_cpu
            ready[h] = cpu + a.handoff_ms
            pos[h] += 1
            moved = True
        if not moved:
            return None
    return max([gpu, cpu] + ready)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--vram-layers", type=int, default=23, help="resident layers + ring slots that fit")
    ap.add_argument("--cpu-ms", type=float, default=26.0, help="a CPU layer of the whole batch")
    ap.add_argument("--copy-ms", type=float, default=9.4, help="one layer's copy into a slot")
    ap.add_argument("--gpu-ms", type=float, default=0.9, help="a GPU layer of the whole batch")
    ap.add_argument("--gpu-half-ms", type=float, default=0.55, help="a GPU layer of half the batch")
    ap.add_argument("--handoff-ms", type=float, default=0.15)
    ap.add_argument("--half-cpu-factor", type=float, default=1.07, help="CPU cost per token of a half vs the whole")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--single", type=float, default=3.9, help="single-request tok/s, for the ratio column")
    a = ap.parse_args()
    print(f"{'mode':<16} {'slots':>5} {'CPU layers':>10} {'pass ms':>8} {'tok/s':>6} {'x single':>8}")
    for halves, mode in ((1, "whole batch"), (2, "two halves")):
        for slots in range(2, 7):
            best = None
            for cpu in range(0, a.layers - (a.vram_layers - slots)):
                t = simulate(placement(a.layers, a.vram_layers - slots, cpu), slots, halves, a)
                if t is not None and (best is None or t < best[0]):
                    best = (t, cpu)
            if best:
                t, cpu = best
                rate = a.tokens * 1000 / t
                print(f"{mode:<16} {slots:>5} {cpu:>10} {t:>8.0f} {rate:>6.1f} {rate / a.single:>8.1f}")
    # Perfect overlap: the CPU and the copy engine both busy the whole pass, GPU time hidden.
    free = a.layers - a.vram_layers + 3
    k = min(range(free + 1), key=lambda k: max(k * a.cpu_ms, (free - k) * a.copy_ms))
    bound = max(k * a.cpu_ms, (free - k) * a.copy_ms)
    print(f"\nperfect overlap, 3 slots: {k} CPU layers, {bound:.0f} ms, {a.tokens * 1000 / bound:.1f} tok/s, "
          f"{a.tokens * 1000 / bound / a.single:.1f}x")


if __name__ == "__main__":
    main()
