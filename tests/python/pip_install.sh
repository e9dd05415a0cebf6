#!/usr/bin/env bash
# The package as a user installs it: a fresh venv (no packages), `pip install .` from the repository
# root (scikit-build-core + nanobind from PyPI build the extension from the top-level CMakeLists.txt;
# numpy and ml_dtypes come as its dependencies), then, outside the source tree, `import indexshare`
# and a golden set, a judgement and a kernel call with numpy arrays. .ci/run runs it after the suite.
#
#   tests/python/pip_install.sh        Environment: WORK_DIR (default build/pip-check), JOBS (nproc)
#
# ccache, when installed (tools/setup.sh installs it), serves the compiles of a repeated run (the
# extension's nanobind sources aside, which sit in pip's temporary build environment): measured on the
# 2-core development machine (shared), 215-260 s cold, 46 s warm. The first run does not reuse
# tools/dev.sh's objects (the command lines differ: the compiler scikit-build-core's CMake picks).
# Prints the wall times.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK="${WORK_DIR:-build/pip-check}"
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}"
rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
start=$(date +%s)
python3 -m venv "$WORK/venv"
export CMAKE_GENERATOR="Unix Makefiles"
launcher=(-Ccmake.define.INDEXSHARE_WERROR=ON)
command -v ccache >/dev/null 2>&1 && launcher+=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
echo "== pip install . into a fresh venv ($WORK/venv)"
"$WORK/venv/bin/python" -m pip install -q "${launcher[@]}" . >"$WORK/pip.log" 2>&1 || { tail -40 "$WORK/pip.log"; exit 1; }
installed=$(date +%s)
echo "   installed in $((installed - start)) s"
cd "$WORK"
venv/bin/python - <<'PY'
import numpy as np
import indexshare
print("   import indexshare", indexshare.__version__, "from", indexshare.__file__)
g = indexshare.golden("sq8 skv16 hq2 dqk64 dv32 ih2 id16 k4 nl2 sched=FS")
cand = {n: np.array(a) for n, a in g.tensors.items() if n.endswith((".attn.out", ".attn.lse"))}
assert indexshare.diff(g, cand).passed
a = indexshare.sparse_attention(g["layers.1.attn.q"], g["layers.1.attn.kv"], g["layers.1.attn.indices"],
                                g.config["sm_scale"], g.config["d_v"])
assert a.out.tobytes() == g["layers.1.attn.out"].tobytes()
print("   golden, diff and sparse_attention work from the installed package")
PY
echo "== pip install check passed ($(( $(date +%s) - start )) s)"
