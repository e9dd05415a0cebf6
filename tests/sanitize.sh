#!/usr/bin/env bash
# Builds everything with AddressSanitizer + UndefinedBehaviorSanitizer (INDEXSHARE_SANITIZE=ON)
# and runs the whole ctest suite except the Python interop tests (they load our libraries into an
# unsanitized Python, which would need the ASan runtime preloaded). For the same reason the Python
# package's extension is not built here (INDEXSHARE_PYTHON=OFF): its tests (tests/python) run in the
# default suite only.
#
#   tests/sanitize.sh [CTEST_ARGS...]          e.g. tests/sanitize.sh -R hostile
#
# Environment: BUILD_DIR (default build-sanitize, in the repository root), CXX (default g++),
# JOBS (default nproc). Besides the top-level's -fsanitize=address,undefined this adds
# -fsanitize=float-cast-overflow (out-of-range float-to-int conversions; GCC's "undefined" group
# leaves it out, clang's includes it). Assertions stay enabled (no NDEBUG). Leaks are errors
# (detect_leaks=1), UB halts (halt_on_error=1); a sanitizer report exits with status 99, so it is
# never mistaken for the CLI's "check failed" status 1. allocator_may_return_null=1 makes an
# impossible allocation throw std::bad_alloc as it does unsanitized (the hostile tests ask for
# absurd problem sizes) instead of aborting in ASan's allocator. The CLI processes the tests start
# inherit the same settings. Exits non-zero on any failure; prints the wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-sanitize}"
JOBS="${JOBS:-$(nproc)}"
CXX="${CXX:-g++}"
start=$(date +%s)

echo "== configure $BUILD_DIR ($CXX, -fsanitize=address,undefined,float-cast-overflow)"
# Without MPI (-DINDEXSHARE_MPI=OFF): Open MPI's own allocations at MPI_Init/Finalize trip the leak
# checker, and the MPI paths are tested by the regular build (ctest -L mpi). Without the Python
# extension (-DINDEXSHARE_PYTHON=OFF): an ASan-built extension cannot load into a normal Python.
cmake -S . -B "$BUILD_DIR" -DCMAKE_CXX_COMPILER="$CXX" -DINDEXSHARE_SANITIZE=ON -DINDEXSHARE_WERROR=ON -DINDEXSHARE_MPI=OFF -DINDEXSHARE_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_FLAGS="-fsanitize=float-cast-overflow -fno-sanitize-recover=float-cast-overflow" >/dev/null
echo "== build"
cmake --build "$BUILD_DIR" -j "$JOBS" >"$BUILD_DIR/sanitize-build.log" 2>&1 || { tail -50 "$BUILD_DIR/sanitize-build.log"; exit 2; }
built=$(date +%s)
echo "   built in $((built - start)) s"

export ASAN_OPTIONS="detect_leaks=1:exitcode=99:allocator_may_return_null=1:strict_string_checks=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=99${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
echo "== ctest -E interop (ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS)"
rc=0
ctest --test-dir "$BUILD_DIR" -E interop -j "$JOBS" --timeout 1200 --output-on-failure "$@" || rc=$?
end=$(date +%s)
echo "== sanitizer suite: $([ $rc -eq 0 ] && echo passed || echo FAILED) (build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s)"
exit $rc
