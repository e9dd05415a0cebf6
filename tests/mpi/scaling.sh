#!/usr/bin/env bash
# MPI scaling of `indexshare golden`: N pairs run back to back, one rank then two ranks (one
# OpenMP thread each), each pair's two sets checked byte-identical, and per pair the wall-time
# and CPU-time speedups, then their medians. Not a ctest (it takes minutes and needs a quiet
# machine to mean anything); run it by hand:
#
#   tests/mpi/scaling.sh [-n PAIRS] [-p PROBLEM] [-c CLI] [-m MPIEXEC] [-r RANKS]
#
#   PAIRS    pairs to run (default 3)
#   PROBLEM  the problem descriptor, or one of the names
#              small   sq16384 skv16384 hq2 dqk576 dv512 ih16 id64 k128 seed1 nl1 (tiny heads:
#                      fixed per-run costs weigh the most; the measurement the README started with)
#              glm     sq16384 skv16384 hq16 dqk576 dv512 ih32 id128 k512 seed1 nl1 (GLM-like heads,
#                      top-k cut to 512 to keep a pair near 2 minutes on 2 cores)
#            (default small)
#   CLI      the indexshare binary (default build/indexshare)
#   MPIEXEC  mpirun (default: mpirun on PATH)
#   RANKS    the second run's rank count (default 2)
#
# Wall time is taken from outside (mpirun start to exit: start-up, generation, compute, write,
# hash, exit). CPU time is each rank's process CPU (user + system, printed by the tool); the
# speedup by CPU is one rank's against the busiest rank's, which is the wall-time speedup the
# machine would give if each rank had a core to itself: prefer it on a loaded machine (the load
# average is printed with each pair). INDEXSHARE_TIMING=1 adds each rank's phase table to the log
# (kept in the work folder printed at the end with -k).
set -euo pipefail
PAIRS=3 PROB=small CLI=build/indexshare MPIEXEC=mpirun RANKS=2 KEEP=0
while getopts "n:p:c:m:r:k" o; do
  case $o in
    n) PAIRS=$OPTARG ;; p) PROB=$OPTARG ;; c) CLI=$OPTARG ;; m) MPIEXEC=$OPTARG ;; r) RANKS=$OPTARG ;; k) KEEP=1 ;;
    *) sed -n '2,25p' "$0" >&2; exit 2 ;;
  esac
done
case $PROB in
  small) PROB='sq16384 skv16384 hq2 dqk576 dv512 ih16 id64 k128 seed1 nl1' ;;
  glm) PROB='sq16384 skv16384 hq16 dqk576 dv512 ih32 id128 k512 seed1 nl1' ;;
esac
CLI=$(realpath "$CLI")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/indexshare-scaling.XXXXXX")
[ "$KEEP" = 1 ] || trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE INDEXSHARE_TIMING=1
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)

run() {  # ranks folder: runs golden, prints "wall maxcpu"
  local np=$1 dir=$2
  rm -rf "$dir" && mkdir -p "$dir"
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$dir" && "$MPIEXEC" "${ROOT[@]}" -n "$np" "$CLI" golden --impl simd --no-logits --problem "$PROB" --out set >log 2>&1) ||
    { cat "$dir/log" >&2; echo "scaling: the $np-rank run failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  local cpu
  cpu=$(awk '/^rank [0-9]+ .*process CPU/ { for (i = 1; i <= NF; ++i) if ($i == "CPU") c = $(i + 1); if (c > m) m = c } END { print m }' "$dir/log")
  echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') $cpu"
}

echo "problem   $PROB"
echo "machine   $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), OMP_NUM_THREADS=1"
printf "%-5s %-17s %10s %10s %12s %12s %9s %9s\n" pair "load (1 min)" "wall 1" "wall $RANKS" "CPU 1" "CPU $RANKS max" "wall x" "CPU x"
walls=() cpus=()
for i in $(seq 1 "$PAIRS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  read -r w1 c1 < <(run 1 "$WORK/one")
  read -r w2 c2 < <(run "$RANKS" "$WORK/ranks")
  cmp -s "$WORK/one/set/tensors.safetensors" "$WORK/ranks/set/tensors.safetensors" || { echo "scaling: pair $i: tensors.safetensors differ" >&2; exit 1; }
  cmp -s "$WORK/one/set/manifest.json" "$WORK/ranks/set/manifest.json" || { echo "scaling: pair $i: manifest.json differs" >&2; exit 1; }
  wx=$(awk -v a="$w1" -v b="$w2" 'BEGIN { print a / b }') cx=$(awk -v a="$c1" -v b="$c2" 'BEGIN { print a / b }')
  walls+=("$wx") cpus+=("$cx")
  printf "%-5s %-17s %9.2fs %9.2fs %11.2fs %11.2fs %8.2fx %8.2fx\n" "$i" "$load" "$w1" "$w2" "$c1" "$c2" "$wx" "$cx"
  [ "$KEEP" = 1 ] && cp "$WORK/one/log" "$WORK/pair$i-1.log" && cp "$WORK/ranks/log" "$WORK/pair$i-$RANKS.log"
done
median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf "median    wall %.2fx, CPU %.2fx over %d pairs; every pair's sets byte-identical\n" "$(median "${walls[@]}")" "$(median "${cpus[@]}")" "$PAIRS"
[ "$KEEP" = 1 ] && echo "logs      $WORK (each rank's phase table: INDEXSHARE_TIMING)"
exit 0
