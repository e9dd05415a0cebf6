#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each on a copy of its seed corpus.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     default: 20 s (at least 1), every target
#
# Environment: BUILD_DIR (default build-fuzz, in the repository root), WORK_DIR (default
# $BUILD_DIR/fuzz-work: working corpora, crash files and logs), JOBS (build jobs, default nproc),
# CXX (default clang++), FUZZ_ARGS (extra libFuzzer flags).
#
# Prints the executions of each target (libFuzzer's final stat::number_of_executed_units) and
# exits non-zero if any target found something (crash, leak, UB, timeout, OOM, or a violated
# property: see tests/fuzz/fuzz_common.h); the crash file's path is printed, and
#   $BUILD_DIR/tests/fuzz/<target> <crash file>
# reproduces it. Inputs that once found a bug live in tests/fuzz/regressions/<target>/ and are
# replayed before each target runs (add a crash file there once its bug is fixed). The seed corpora
# in tests/fuzz/corpus/ are only read: each run starts from a fresh copy in WORK_DIR (regenerate
# seeds and regression inputs with tests/fuzz/make_corpus.py).
#
# Long runs: give more seconds, e.g. an hour per target, and keep the grown corpus between runs:
#   WORK_DIR=/var/tmp/indexshare-fuzz KEEP_CORPUS=1 tests/fuzz/run.sh 3600
# (KEEP_CORPUS=1 reuses WORK_DIR/<target>/corpus instead of starting again from the seeds), or
# run one target by hand on several cores:
#   build-fuzz/tests/fuzz/fuzz_safetensors -fork=4 -max_total_time=36000 \
#       -artifact_prefix=/var/tmp/crashes/ /var/tmp/corpus-st tests/fuzz/corpus/fuzz_safetensors
# (the first corpus folder receives new inputs; never point it at tests/fuzz/corpus).
set -uo pipefail
cd "$(dirname "$0")/../.."

secs="${1:-20}"
shift $(( $# > 0 ? 1 : 0 ))
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_safetensors fuzz_manifest fuzz_problem fuzz_schedule fuzz_diff)
BUILD_DIR="${BUILD_DIR:-build-fuzz}"
WORK_DIR="${WORK_DIR:-$BUILD_DIR/fuzz-work}"
JOBS="${JOBS:-$(nproc)}"
CXX="${CXX:-clang++}"
WORK_DIR=$(realpath -m "$WORK_DIR")
case "$secs" in ''|0|*[!0-9]*) echo "usage: tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2 ;; esac

echo "== configure $BUILD_DIR ($CXX)"
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=Release -DINDEXSHARE_FUZZ=ON \
  >"$BUILD_DIR/fuzz-configure.log" 2>&1 || { cat "$BUILD_DIR/fuzz-configure.log"; exit 2; }
echo "== build ${targets[*]}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" >"$BUILD_DIR/fuzz-build.log" 2>&1 ||
  { tail -50 "$BUILD_DIR/fuzz-build.log"; exit 2; }

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
status=0
summary=""
for t in "${targets[@]}"; do
  w="$WORK_DIR/$t"
  mkdir -p "$w/artifacts"
  if [ -z "${KEEP_CORPUS:-}" ] || [ ! -d "$w/corpus" ]; then
    rm -rf "$w/corpus"
    mkdir -p "$w/corpus"
    cp tests/fuzz/corpus/"$t"/* "$w/corpus/"
  fi
  rm -f "$w/artifacts"/*
  # The targets' scratch folders (fuzz_common.h) go here, not to /tmp, with whatever a crash leaves.
  export TMPDIR="$w/tmp"
  rm -rf "$TMPDIR"
  mkdir -p "$TMPDIR"
  # Inputs that once crashed the target (tests/fuzz/regressions/<target>/) are replayed first.
  for r in tests/fuzz/regressions/"$t"/*; do
    [ -f "$r" ] || continue
    if ! timeout 120 "$BUILD_DIR/tests/fuzz/$t" "$r" >"$w/regression.log" 2>&1; then
      status=1
      echo "!! $t: regression input $r fails again (reproduce: $BUILD_DIR/tests/fuzz/$t $r)"
      grep -E 'FUZZ FINDING|Assertion|runtime error|ERROR: AddressSanitizer|SUMMARY' "$w/regression.log" | head -5
      summary+=$(printf '%-18s regression %s FAILS\n' "$t" "$(basename "$r")")$'\n'
    fi
  done
  echo "== $t: ${secs} s on $(ls "$w/corpus" | wc -l) inputs"
  # -timeout: one input running longer is a finding (a hang); -rss_limit_mb: OOM is a finding.
  # shellcheck disable=SC2086
  timeout --signal=KILL $((secs + 300)) "$BUILD_DIR/tests/fuzz/$t" -max_total_time="$secs" -timeout=60 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$w/artifacts/" ${FUZZ_ARGS:-} "$w/corpus" \
    >"$w/log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$w/log" | tail -1 | grep -o '[0-9]*$')
  crashes=$(ls "$w/artifacts" 2>/dev/null)
  if [ $rc -ne 0 ] || [ -n "$crashes" ]; then
    status=1
    echo "!! $t: FINDING (exit $rc) after ${execs:-?} executions; log $w/log"
    grep -E 'ERROR|FUZZ FINDING|Assertion|runtime error|SUMMARY|Test unit written|deadly signal' "$w/log" | head -20
    for c in $crashes; do echo "   crash file: $w/artifacts/$c"; done
    summary+=$(printf '%-18s %12s executions  FINDING\n' "$t" "${execs:-?}")$'\n'
  else
    summary+=$(printf '%-18s %12s executions  ok\n' "$t" "$execs")$'\n'
  fi
done
echo "== summary (${secs} s per target)"
printf '%s' "$summary"
exit $status
