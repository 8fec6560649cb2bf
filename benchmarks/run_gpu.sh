#!/usr/bin/env bash
# The GPU checks in one run, for a CUDA machine (a lent one without network included):
#   bash benchmarks/run_gpu.sh [bench_gpu.py arguments, e.g. --tune]
# Runs `nox -s tests_gpu` and `nox -s bench_gpu` (the decode step, then the kernels) with the python3 that holds the machine's
# CUDA torch and Triton, and writes the logs and JSON to $OUT (default results/gpu). Each
# step has a time limit (TESTS_S, STEP_S, BENCH_S seconds), so a slow one leaves time to the next.
# Offline: put wheels of nox and hatchling (and their dependencies) in .whl/ first:
#   python3 -m pip download --only-binary=:all: --python-version 3.12 -d .whl nox hatchling
# They are installed into /tmp/kvpolicy-site, and pip builds kvpolicy's distributions from
# them (PIP_NO_INDEX, PIP_FIND_LINKS).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))" \
  2>&1 | tee -a "$out/nvidia-smi.txt"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvpolicy-site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/kvpolicy-site${PYTHONPATH:+:$PYTHONPATH}
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
fi
status=0
start=$(date +%s)
timeout "${TESTS_S:-240}" python3 -m nox -s tests_gpu 2>&1 | tee "$out/tests_gpu.log" || status=1
echo "tests_gpu: $(( $(date +%s) - start )) s" | tee -a "$out/tests_gpu.log"
start=$(date +%s)
timeout "${STEP_S:-240}" python3 -m nox -s bench_gpu -- benchmarks/bench_gpu_step.py --out="$out" 2>&1 | tee "$out/bench_gpu_step.log" \
  || status=1
echo "bench_gpu_step: $(( $(date +%s) - start )) s" | tee -a "$out/bench_gpu_step.log"
start=$(date +%s)
timeout "${BENCH_S:-400}" python3 -m nox -s bench_gpu -- benchmarks/bench_gpu.py --out="$out" "$@" 2>&1 | tee "$out/bench_gpu.log" \
  || status=1
echo "bench_gpu: $(( $(date +%s) - start )) s" | tee -a "$out/bench_gpu.log"
exit $status
