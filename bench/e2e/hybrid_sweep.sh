#!/usr/bin/env bash
# Hybrid execution vs pure streaming vs llama.cpp's best partial offload on one model, for several
# amounts of free GPU memory, same machine, same call. For each point a holder process
# (tools/gpu/vram_hold) keeps all but FREE GiB of the GPU, so llama.cpp (which sizes itself from
# free memory) and sluice (--vram-budget auto: the free memory its own CUDA context leaves, less
# 256 MiB; BUDGET=margin gives the older FREE-1 GiB) see the same budget.
#
#   SLUICE=bin LLAMA=llama-bench-cuda HOLD=vram_hold bench/e2e/hybrid_sweep.sh MODEL OUT.csv FREE_GIB...
#
# Env: TG (decoded tokens per run, default 16), REPS (sluice runs per mode, median kept, default
# 1), BUDGET (auto, default, or margin), CTX (sluice's -c, default 512: llama-bench sizes
# its KV cache to the test, a few positions, so sluice's default 4096-position cache would spend
# ~1.3 GB of a 70B's budget that the rival does not), THREADS (default nproc), NGL_PER_GIB / NGL_BASE (the
# estimate of llama.cpp's largest -ngl that fits: (FREE - NGL_BASE) * NGL_PER_GIB; it tries 2 fewer,
# then upward in steps of 2 (and 81, all layers, last) until a run fails, keeping the best that
# ran; llama-bench -r REPS), LOGDIR (full outputs; default OUT.csv's folder).
# Appends rows "free_gib,engine,config,tok_s,bound_tok_s" to OUT.csv (header once); bound_tok_s is
# the physical bound of the placement sluice chose (resident bytes at the device copy rate, every
# other byte once through DRAM at the CPU + DMA rate measured at start-up), on sluice rows only.
set -uo pipefail
model=${1:?usage: hybrid_sweep.sh MODEL OUT.csv FREE_GIB...}
out=${2:?usage: hybrid_sweep.sh MODEL OUT.csv FREE_GIB...}
shift 2
: "${SLUICE:?set SLUICE}" "${HOLD:?set HOLD}"
tg=${TG:-16}
threads=${THREADS:-$(nproc)}
logdir=${LOGDIR:-$(dirname "$out")}
mkdir -p "$logdir"
[[ -s $out ]] || echo "free_gib,engine,config,tok_s,bound_tok_s" >"$out"

hold_pid=""
hold() {  # FREE_GIB: start the holder and wait until it holds
  local fifo; fifo=$(mktemp -u) && mkfifo "$fifo"
  "$HOLD" "$1" >"$fifo" 2>&1 &
  hold_pid=$!
  read -r line <"$fifo"; rm -f "$fifo"
  echo "  $line"
}
release() { [[ -n $hold_pid ]] && kill "$hold_pid" 2>/dev/null && wait "$hold_pid" 2>/dev/null; hold_pid=""; }
trap release EXIT

# tok/s from sluice run's "decode:  N tokens in S s = X tok/s" line.
decode_rate() { awk '/^decode:/ {for (i = 1; i <= NF; i++) if ($i == "tok/s") print $(i - 1)}' "$1" | tail -1; }
# The bound of the run's placement: per-token VRAM-resident MB at the device copy rate (from
# `plan`'s vram bandwidth, else 3000 GB/s) plus every other MB through DRAM at the probe's
# "S GB/s + H2D H GB/s together" (S + H), else at the H2D rate alone.
bound_rate() {
  python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"VRAM-resident ([\d.]+) MB, pinned RAM copied ([\d.]+) MB, computed by the CPU ([\d.]+) MB, disk ([\d.]+) MB", t)
if not m:
    print(""); sys.exit()
vram, ram, cpu, disk = (float(x) * 1e6 for x in m.groups())
p = re.search(r"([\d.]+) GB/s \+ H2D ([\d.]+) GB/s together", t)
dram = (float(p.group(1)) + float(p.group(2))) * 1e9 if p else 55e9
print("%.3f" % (1.0 / (vram / 3.0e12 + (ram + cpu + disk) / dram)))
PY
}

for free in "$@"; do
  echo "== $free GiB free"
  hold "$free"
  budget=auto; [[ ${BUDGET:-auto} == margin ]] && budget="$((free - 1))G"
  for mode in hybrid pure; do
    flags=(); [[ $mode == pure ]] && flags=(--no-hybrid)
    rates=()
    for rep in $(seq "${REPS:-1}"); do
      log="$logdir/sluice_${free}g_${mode}.txt"
      timeout 400 "$SLUICE" run -m "$model" --backend cuda --vram-budget "$budget" -t "$threads" -c "${CTX:-512}" -p "The" -n "$tg" \
        --temp 0 "${flags[@]}" >"$log.out" 2>"$log"
      rate=$(decode_rate "$log")
      cp "$log" "$logdir/sluice_${free}g_${mode}_rep$rep.txt"
      [[ -n $rate ]] && rates+=("$rate")
    done
    rate=$(printf '%s\n' "${rates[@]}" | sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]}')
    echo "  sluice $mode (--vram-budget $budget): ${rate:-failed} tok/s, runs: ${rates[*]} ($(grep -m1 '^plan:' "$log" | cut -c1-90))"
    echo "$free,sluice,$mode,${rate:-},$(bound_rate "$log")" >>"$out"
  done
  if cmp -s "$logdir/sluice_${free}g_hybrid.txt.out" "$logdir/sluice_${free}g_pure.txt.out"; then
    echo "  greedy output identical (hybrid vs pure streaming)"
  else
    echo "  greedy output DIFFERS (hybrid vs pure streaming)"
  fi
  if [[ -n ${LLAMA:-} && -x ${LLAMA:-} ]]; then
    est=$(python3 -c "print(max(0, min(81, int(($free - ${NGL_BASE:-1.2}) * ${NGL_PER_GIB:-2.05}))))")
    ngl=$((est > 2 ? est - 2 : 0))
    while :; do
      log="$logdir/llama_${free}g_ngl${ngl}.txt"
      timeout 300 "$LLAMA" -m "$model" -ngl "$ngl" -p 0 -n "$tg" -r "${REPS:-1}" -t "$threads" -o csv >"$log" 2>"$log.err"
      rate=$(python3 -c "
import csv, sys
rows = [r for r in csv.DictReader(open('$log')) if r.get('n_gen') not in (None, '0')]
print(rows[-1]['avg_ts'] if rows else '')" 2>/dev/null)
      echo "  llama.cpp -ngl $ngl: ${rate:-failed (does not fit?)} tok/s"
      [[ -n $rate ]] && echo "$free,llama.cpp,ngl $ngl,$rate," >>"$out"
      # Upward until a run fails or every layer and the output are on the GPU.
      if [[ $ngl -ge 81 || -z $rate ]]; then break; fi
      ngl=$((ngl + 2 > 81 ? 81 : ngl + 2))
    done
  fi
  release
done
