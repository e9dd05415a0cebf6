#!/usr/bin/env bash
# The MPI paths of indexshare (tools/lib/distributed.h) against one process: byte-identical golden
# sets, the same run / overlap / search reports, and failing ranks that leave nothing behind.
#
#   tests/mpi/ranks.sh CLI MPIEXEC NPROCS CASE
#
# CASE: stack, rows, decode, for-kernel, from, simd, subset (a set over 256 rows: the budget's
# row subset), fail-budget, fail-compute, fail-write, fail-hash, fail-memory,
# kill, refuse-edge, run (the same report), overlap (with and without --no-shared-stats: the same
# report), search (the same report, each loss, from --problem and --from), search-fail (a failing rank). Each golden case writes the set with one process and with
# NPROCS ranks (same --out text, from two working folders, so the replay lines agree) and
# compares manifest.json and tensors.safetensors byte for byte, then every tensor's SHA-256 in
# the two manifests. mpirun runs as root in CI and on 2 cores: --allow-run-as-root --oversubscribe.
set -euo pipefail
CLI=$1 MPIEXEC=$2 NP=$3 CASE=$4
WORK=$(mktemp -d "${TMPDIR:-/tmp}/indexshare-mpi.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/one" "$WORK/ranks"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
mpi() { "$MPIEXEC" --allow-run-as-root --oversubscribe -n "$NP" "$CLI" "$@"; }
fail() { echo "FAIL ($CASE, $NP ranks): $*" >&2; exit 1; }

PROB='sq48 skv96 hq2 dqk64 dv32 ih4 id32 k8 seed11 nseq2 nl4 sched=FFSS recency=0.25 sinks=2'

same_set() {  # golden args...: one process vs NPROCS ranks
  (cd "$WORK/one" && "$CLI" golden "$@" --out set >one.out) || fail "one process failed"
  (cd "$WORK/ranks" && mpi golden "$@" --out set >ranks.out 2>ranks.err) || { cat "$WORK/ranks/ranks.err" >&2; fail "ranks failed"; }
  cmp "$WORK/one/set/manifest.json" "$WORK/ranks/set/manifest.json" || fail "manifest.json differs"
  cmp "$WORK/one/set/tensors.safetensors" "$WORK/ranks/set/tensors.safetensors" || fail "tensors.safetensors differs"
  local n
  n=$(grep -c '"sha256"' "$WORK/ranks/set/manifest.json")
  [ "$n" -gt 10 ] || fail "only $n tensors"
  # The manifest's hashes are the bytes' (verify re-reads every tensor), and the rank table printed.
  "$CLI" verify --golden "$WORK/ranks/set" >/dev/null || fail "verify refused the ranks' set"
  grep -q "^rank $((NP - 1)) " "$WORK/ranks/ranks.out" || fail "no per-rank line for rank $((NP - 1))"
  ls "$WORK/ranks" | grep -q tmp && fail "a temporary folder remains"
  echo "ok: $CASE on $NP ranks: $n tensors byte-identical"
}

expect_failure() {  # message-pattern, then golden args (with env already set)
  local pattern=$1; shift
  local rc=0
  (cd "$WORK/ranks" && mpi golden "$@" --out set >ranks.out 2>ranks.err) || rc=$?
  [ "$rc" -ne 0 ] || fail "the job succeeded"
  grep -q -- "$pattern" "$WORK/ranks/ranks.err" || { cat "$WORK/ranks/ranks.err" >&2; fail "no '$pattern' in the error"; }
  [ ! -e "$WORK/ranks/set" ] || fail "the output folder exists"
  [ -z "$(ls "$WORK/ranks" | grep tmp)" ] || fail "a temporary folder remains: $(ls "$WORK/ranks")"
  echo "ok: $CASE on $NP ranks: exit $rc, $(grep -m1 error "$WORK/ranks/ranks.err")"
}

case "$CASE" in
  stack) same_set --problem "$PROB" ;;
  simd) same_set --problem "$PROB" --impl simd --no-logits ;;
  rows) same_set --problem "$PROB" --rows last:2,0,16-18,9,30-40 ;;
  decode) same_set --preset decode ;;
  for-kernel)  # golden --for: the kernel's call in the manifest, from the key-side tensors
    same_set --problem "sq64 skv256 hq64 dqk576 dv512 ih4 id128 k128 seed3 nl2 sched=FS" --for flashmla-sparse-prefill-sm90 --no-logits --impl simd ;;
  from)
    (cd "$WORK" && "$CLI" golden --problem "$PROB" --out dump >/dev/null)
    same_set --from "$WORK/dump/tensors.safetensors" --problem "k8 dv32 sched=FFSS" ;;
  subset)  # over kBudgetAllRows rows: the budget's row subset is chosen from every rank's rows
    same_set --problem "sq320 skv320 hq2 dqk64 dv32 ih4 id32 k8 seed5 nseq2 nl2 sched=FS sinks=2"
    grep -q '"emulation_rows": "[0-9]* of 320 rows' "$WORK/ranks/set/manifest.json" || fail "no emulation_rows in the manifest" ;;
  fail-budget)  # a rank failing before the gather of the budget's row maxima: no rank waits forever
    # (a hang would run into the ctest's timeout)
    INDEXSHARE_MPI_FAULT="1:budget" expect_failure "rank 1 of $NP: injected fault at step 'budget'" \
        --problem "sq320 skv320 hq2 dqk64 dv32 ih4 id32 k8 seed5 nl2" ;;
  fail-compute|fail-write|fail-hash)
    INDEXSHARE_MPI_FAULT="1:${CASE#fail-}" expect_failure "rank 1 of $NP: injected fault at step '${CASE#fail-}'" --problem "$PROB" ;;
  fail-memory)
    # Rank 0's block holds the most rows (the cheap early ones): a budget between the ranks'
    # estimates fails rank 0 only.
    expect_failure "rank 0 of $NP: the problem needs about" --problem "sq512 skv512 hq2 dqk64 dv32 ih4 id32 k8 seed3 nl2" --max-memory 6M ;;
  kill)
    # A rank killed outright mid-write: the launcher ends the job; the final folder never appears
    # (only the temporary <out>.tmp.mpi.<pid> remains, never read as a set, and the next run
    # removes it once its owner is gone).
    rc=0
    (cd "$WORK/ranks" && INDEXSHARE_MPI_FAULT=1:kill-write mpi golden --problem "$PROB" --out set >ranks.out 2>ranks.err) || rc=$?
    [ "$rc" -ne 0 ] || fail "the job succeeded"
    [ ! -e "$WORK/ranks/set" ] || fail "the output folder exists"
    grep -qi "signal 9\|killed" "$WORK/ranks/ranks.err" || { cat "$WORK/ranks/ranks.err" >&2; fail "no word of the killed rank"; }
    # The temporary folder the job left carries its owner record (rank 0's host, boot, pid, start).
    stale=$(ls -d "$WORK"/ranks/set.tmp.mpi.* 2>/dev/null | head -1)
    [ -n "$stale" ] && [ -f "$stale/.indexshare-owner" ] || fail "no temporary folder with an owner record: $(ls -a "$WORK/ranks")"
    pid=$(awk '$1 == "pid" { print $2 }' "$stale/.indexshare-owner")
    for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.2; done  # the launcher ends rank 0 too
    [ ! -e "/proc/$pid" ] || fail "rank 0 (pid $pid) of the killed job still runs"
    # Beside it: a folder another host owns, one whose owner runs (this shell), one without a record.
    mkdir "$WORK/ranks/set.tmp.mpi.1" "$WORK/ranks/set.tmp.mpi.2" "$WORK/ranks/set.tmp.3"
    printf 'host elsewhere\nboot x\npid 1\nstart 1\n' >"$WORK/ranks/set.tmp.mpi.1/.indexshare-owner"
    sed "s/^pid .*/pid $$/; s/^start .*/start $(awk '{ sub(/.*\) /, ""); print $20 }' /proc/$$/stat)/" "$stale/.indexshare-owner" \
      >"$WORK/ranks/set.tmp.mpi.2/.indexshare-owner"
    # The same command again: it removes the dead job's folder (and says so), leaves the others,
    # and writes the set, byte-identical to one process's.
    (cd "$WORK/ranks" && mpi golden --problem "$PROB" --out set >ranks.out 2>ranks.err) || { cat "$WORK/ranks/ranks.err" >&2; fail "the rerun failed"; }
    grep -q "removed .*$(basename "$stale"), left by process $pid" "$WORK/ranks/ranks.err" || { cat "$WORK/ranks/ranks.err" >&2; fail "no word of the stale folder"; }
    [ ! -e "$stale" ] || fail "the stale folder remains"
    [ -d "$WORK/ranks/set.tmp.mpi.1" ] && [ -d "$WORK/ranks/set.tmp.mpi.2" ] && [ -d "$WORK/ranks/set.tmp.3" ] || fail "a folder not proven stale was removed"
    grep -q "set.tmp.mpi.1 is being written, or was left, by process 1 on elsewhere" "$WORK/ranks/ranks.err" || fail "no note of the other host's folder"
    grep -q "set.tmp.3 is a temporary folder without an owner record" "$WORK/ranks/ranks.err" || fail "no note of the folder without a record"
    grep -q "set.tmp.mpi.2 " "$WORK/ranks/ranks.err" && fail "a note about the folder of a running process"
    (cd "$WORK/one" && "$CLI" golden --problem "$PROB" --out set >/dev/null) || fail "one process failed"
    cmp "$WORK/one/set/tensors.safetensors" "$WORK/ranks/set/tensors.safetensors" || fail "tensors.safetensors differs"
    [ "$(ls -A "$WORK/ranks/set")" = "$(printf 'manifest.json\ntensors.safetensors')" ] || fail "the set holds more than its two files: $(ls -A "$WORK/ranks/set")"
    echo "ok: kill on $NP ranks: exit $rc, no output folder; the rerun removed $(basename "$stale") and kept the 3 others" ;;
  run)
    # run's report: the same lines as one process (rank 0 folds the ranks' rows in order), but
    # the timing lines and the rank table.
    for extra in "" "--rows 0,5-20,last:3 --impl simd"; do
      "$CLI" run --problem "$PROB" $extra | grep -v '^time' >"$WORK/one/run.txt"
      mpi run --problem "$PROB" $extra | grep -v '^time\|^rank ' >"$WORK/ranks/run.txt"
      diff "$WORK/one/run.txt" "$WORK/ranks/run.txt" || fail "run reports differ ($extra)"
    done
    echo "ok: run on $NP ranks: the same report" ;;
  overlap)
    # overlap, with and without the Shared layers' statistics: the same table and JSON as one
    # process, from each source.
    (cd "$WORK" && "$CLI" golden --problem "$PROB" --out g >/dev/null)
    for stats in --no-shared-stats ""; do
    for src in problem golden from; do
      case $src in
        problem) args=(--problem "$PROB") ;;
        golden) args=(--golden "$WORK/g") ;;
        from) args=(--from "$WORK/g/tensors.safetensors" --from-problem "k8 dv32 sched=FFSS") ;;
      esac
      "$CLI" overlap "${args[@]}" $stats --buckets 4 --json "$WORK/one/o.json" >"$WORK/one/o.txt" || fail "one process ($src $stats)"
      mpi overlap "${args[@]}" $stats --buckets 4 --json "$WORK/ranks/o.json" >"$WORK/ranks/o.txt" || fail "ranks ($src $stats)"
      cmp "$WORK/one/o.json" "$WORK/ranks/o.json" || fail "overlap JSON differs ($src $stats)"
      diff "$WORK/one/o.txt" "$WORK/ranks/o.txt" || fail "overlap table differs ($src $stats)"
      if [ -z "$stats" ]; then grep -q '"mass_recall"' "$WORK/ranks/o.json" || fail "no Shared-layer statistics ($src)"; fi
      rm -f "$WORK/one/o.json" "$WORK/ranks/o.json"
    done
    done
    echo "ok: overlap on $NP ranks: the same report from --problem, --golden and --from, with and without the Shared-layer statistics" ;;
  search)
    # search: the same table, JSON and CSV as one process, for each loss, from --problem and --from.
    SPROB='sq48 skv96 hq2 dqk64 dv32 ih4 id32 k8 seed11 nseq2 nl4 recency=0.25 sinks=2'
    (cd "$WORK" && "$CLI" golden --problem "$SPROB" --out s >/dev/null)
    for src in problem from; do
      case $src in
        problem) args=(--problem "$SPROB") ;;
        from) args=(--from "$WORK/s/tensors.safetensors" --from-problem "k8 dv32 nl4") ;;
      esac
      for loss in output mass kl; do
        "$CLI" search "${args[@]}" --loss $loss --json "$WORK/one/s.json" --csv "$WORK/one/s.csv" >"$WORK/one/s.txt" || fail "one process ($src, $loss)"
        mpi search "${args[@]}" --loss $loss --json "$WORK/ranks/s.json" --csv "$WORK/ranks/s.csv" >"$WORK/ranks/s.txt" || fail "ranks ($src, $loss)"
        cmp "$WORK/one/s.json" "$WORK/ranks/s.json" || fail "search JSON differs ($src, $loss)"
        cmp "$WORK/one/s.csv" "$WORK/ranks/s.csv" || fail "search CSV differs ($src, $loss)"
        diff "$WORK/one/s.txt" "$WORK/ranks/s.txt" || fail "search table differs ($src, $loss)"
        grep -q '"steps"' "$WORK/ranks/s.json" || fail "no steps in the JSON ($src, $loss)"
        rm -f "$WORK"/one/s.* "$WORK"/ranks/s.*
      done
    done
    echo "ok: search on $NP ranks: the same report from --problem and --from, losses output, mass, kl" ;;
  search-fail)
    # A rank that fails while computing its rows: one clear error, exit 2 on every rank.
    rc=0
    INDEXSHARE_MPI_FAULT="1:compute" mpi search --problem "sq48 skv96 hq2 dqk64 dv32 ih4 id32 k8 seed11 nl4" \
      >"$WORK/ranks/o.out" 2>"$WORK/ranks/o.err" || rc=$?
    [ "$rc" -ne 0 ] || fail "the job succeeded"
    grep -q "rank 1 of $NP: injected fault at step 'compute'" "$WORK/ranks/o.err" || { cat "$WORK/ranks/o.err" >&2; fail "no clear error"; }
    # A rank that fails inside a cost step (no collective check there): the job ends (MPI_Abort)
    # with the rank's error instead of the other ranks waiting forever; timeout guards the hang.
    rc2=0
    INDEXSHARE_MPI_FAULT="1:cost" timeout 60 "$MPIEXEC" --allow-run-as-root --oversubscribe -n "$NP" "$CLI" search \
      --problem "sq48 skv96 hq2 dqk64 dv32 ih4 id32 k8 seed11 nl4" >"$WORK/ranks/c.out" 2>"$WORK/ranks/c.err" || rc2=$?
    [ "$rc2" -ne 0 ] && [ "$rc2" -ne 124 ] || { cat "$WORK/ranks/c.err" >&2; fail "a failed cost step: exit $rc2 (124: hung)"; }
    grep -q "rank 1 of $NP: injected fault at step 'cost'" "$WORK/ranks/c.err" || { cat "$WORK/ranks/c.err" >&2; fail "no clear error for the cost step"; }
    echo "ok: search-fail on $NP ranks: exit $rc, a failed cost step: exit $rc2" ;;
  refuse-edge)
    expect_failure "attention-edge set .* is computed by one process" --preset attention-edge ;;
  *) fail "unknown case" ;;
esac
