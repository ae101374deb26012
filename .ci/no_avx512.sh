#!/usr/bin/env bash
# The unit and property tests again on the code paths of a CPU without AVX-512.
#
# numpy, torch, OpenBLAS, MKL, oneDNN and numba pick their SIMD kernels at run time, so the
# same float computation can differ by an ulp between a machine with AVX-512 and one without
# (an AMD EPYC without it failed a test that compared numpy's exp with torch's bit for bit).
# On a machine that has AVX-512 this forces every library onto its AVX2 paths and runs the
# quick subset: a test comparing two libraries' floats exactly fails here, not on a user's
# machine. On a machine without AVX-512, `make test` already ran those paths: nothing to do.
#   .ci/no_avx512.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! grep -qw avx512f /proc/cpuinfo; then
    echo "no AVX-512 on this CPU: make test ran the AVX2 paths already"
    exit 0
fi
export ATEN_CPU_CAPABILITY=avx2                                 # torch's CPU kernels
export NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR"  # numpy 2.x's dispatch groups
export OPENBLAS_CORETYPE=Haswell                                # numpy/scipy's OpenBLAS
export NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=               # numba (empty FEATURES: no host extras)
export MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2     # torch's MKL and oneDNN
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the settings took effect
.venv/bin/python - <<'EOF'
import torch
from numpy._core._multiarray_umath import __cpu_features__ as feats

cap = torch.backends.cpu.get_cpu_capability()
assert cap == "AVX2", f"torch still on {cap}"
on = [f for f in ("X86_V4", "AVX512_SKX", "AVX512_ICL", "AVX512_SPR") if feats.get(f)]
assert not on, f"numpy still dispatches to {on}"
print(f"torch on {cap}, numpy on X86_V3 (AVX2), numba compiling for haswell")
EOF
.venv/bin/python -m pytest -q -n 2 -m "not slow and not workflow" -p no:cacheprovider
