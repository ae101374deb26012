#!/usr/bin/env bash
# The checks that need a CUDA device, as one script (run from the repository root on a machine
# with a GPU; this machine has none):
#   bash bench/gpu_check.sh [OUT_DIR]
# 1. the tests whose GPU cases skip here (compute dtypes and device_map of hf models, the EMD
#    kernels on cuda), 2. the organization on cuda against the CPU (the same trees), 3. the
#    extraction benchmark by compute dtype (bench/gpu_extract.py). Where the Python there lacks a
#    pinned package, wheels in .whl/ (git-ignored) are installed into /tmp/site first.
set -uo pipefail
out=${1:-${OUT:-/tmp}}
mkdir -p "$out"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    rm -rf /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, zarr; print('torch', torch.__version__, 'transformers', transformers.__version__, 'zarr', zarr.__version__)"

echo "== tests with GPU cases"
python3 -m pytest -p no:cacheprovider -q -rs tests/test_hf_bigger.py tests/test_hf_config.py -k "not workflow" \
    tests/test_emd.py 2>&1 | tail -25 | tee "$out/gpu_tests.log"

echo "== organization on cuda against the CPU"
python3 - <<'EOF' 2>&1 | tee "$out/gpu_organize.log"
import time

import numpy as np
import xarray as xr

import oattn_lib as oattn

rng = np.random.default_rng(0)
for n, heads in ((96, 24), (512, 64)):
    x = rng.random((4, heads // 4, n, n)).astype(np.float32) ** 8
    x /= x.sum(-1, keepdims=True)
    da = xr.DataArray(x, dims=("layer", "head", "query", "key"))
    t = time.perf_counter()
    cpu = oattn.organize(da, "probs", device="cpu")
    t_cpu = time.perf_counter() - t
    oattn.organize(da, "probs", device="cuda")  # warm-up
    t = time.perf_counter()
    gpu = oattn.organize(da, "probs", device="cuda")
    t_gpu = time.perf_counter() - t
    same = all(np.array_equal(cpu[v].values, gpu[v].values) for v in ("tree_q", "tree_k", "tree_h"))
    aff = max(float(np.abs(cpu[v].values - gpu[v].values).max()) for v in ("affinity_q", "affinity_k", "affinity_h"))
    print(f"{n} tokens x {heads} heads: same trees {same}, max affinity difference {aff:.2e}, "
          f"cpu {t_cpu:.2f} s, cuda {t_gpu:.2f} s")
EOF

echo "== extraction by compute dtype"
python3 bench/gpu_extract.py --shapes smollm2 --tokens 1024,2048 --repeats 1 --device-map 2>&1 | tee "$out/gpu_extract.log"
python3 bench/gpu_extract.py --shapes 1b --tokens 1024 --repeats 1 2>&1 | tee -a "$out/gpu_extract.log"
