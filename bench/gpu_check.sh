#!/usr/bin/env bash
# The checks that need a CUDA device, as one script (run from the repository root on a machine
# with a GPU; this machine has none):
#   bash bench/gpu_check.sh [OUT_DIR] [PARTS]
# PARTS (default all), comma-separated: tests (the tests whose GPU cases skip here: every
# stage's CPU-vs-GPU comparison in tests/test_gpu.py, compute dtypes and device_map of hf models,
# the EMD kernels on cuda), organize (the organization on cuda against the CPU: the same trees),
# stages (bench/gpu_stages.py: the LLM preset's per-sample stages and prune on the GPU at 1024
# tokens), stages4k (3 layers at 4096), extract (bench/gpu_extract.py by compute dtype). Where the
# Python there lacks a pinned package, wheels in .whl/ (git-ignored) are installed into
# /tmp/site first.
set -uo pipefail
out=${1:-${OUT:-/tmp}}
parts=${2:-tests,organize,stages,stages4k,extract}
mkdir -p "$out"
want() { [[ ",$parts," == *",$1,"* ]]; }
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    rm -rf /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, zarr; print('torch', torch.__version__, 'transformers', transformers.__version__, 'zarr', zarr.__version__)"

if want tests; then
echo "== tests with GPU cases"
timeout 150 python3 -m pytest -p no:cacheprovider -q -rfEs -n 4 tests/test_gpu.py tests/test_hf_bigger.py \
    tests/test_emd.py > "$out/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$out/gpu_tests.log"
fi

if want organize; then
echo "== organization on cuda against the CPU"
timeout 80 python3 - <<'EOF' 2>&1 | tee "$out/gpu_organize.log"
import time

import numpy as np
import xarray as xr

import oattn_lib as oattn

rng = np.random.default_rng(0)
for n, heads in ((96, 24), (256, 48)):
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
fi

if want stages; then
echo "== the LLM preset's stages on the GPU"
timeout 220 python3 bench/gpu_stages.py --tokens 1024 --log "$out/gpu_stages_1024.log" 2>&1 | grep -v "it/s\]" \
    | tee "$out/gpu_stages.txt"
fi

if want stages4k; then
echo "== 3 of the LLM's layers at 4096 tokens on the GPU"
timeout 120 python3 bench/gpu_stages.py --tokens 4096 --layers 3 --stages extract,organize,decompose,entropy,theorem1 \
    --log "$out/gpu_stages_4096.log" 2>&1 | grep -v "it/s\]" | tee -a "$out/gpu_stages.txt"
fi

if want extract; then
echo "== extraction by compute dtype"
python3 bench/gpu_extract.py --shapes smollm2 --tokens 1024,2048 --repeats 1 --device-map 2>&1 | tee "$out/gpu_extract.log"
python3 bench/gpu_extract.py --shapes 1b --tokens 1024 --repeats 1 2>&1 | tee -a "$out/gpu_extract.log"
fi
