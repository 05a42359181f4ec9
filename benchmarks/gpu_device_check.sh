#!/usr/bin/env bash
# One GPU machine, one run, from the repository root: `zerocomm-bench gpu` and the CUDA tests, logs into $OUT.
#
#   bash benchmarks/gpu_device_check.sh            # OUT defaults to /tmp/zerocomm-gpu-check
#
# The repository root is the `zerocomm` package: a link /tmp/zc/zerocomm -> the checkout makes it importable
# without installing (the machine's own python3, torch, cupy and pytest serve; C extensions built for another
# Python are skipped by their pure-Python fallbacks).  Budget: the benchmark at most BENCH_S seconds, the tests
# at most TESTS_S (SIGINT at the limit, so pytest still writes its report).  What comes back in $OUT:
#   env.log  bench.log  gpu.json  cuda-tests.log  cuda-tests.xml  summary.log
# and stdout ends with the test summary and the benchmark's tables.
set -u
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/zerocomm-gpu-check}
BENCH_S=${BENCH_S:-210}
TESTS_S=${TESTS_S:-330}
ROOT=$(pwd)
mkdir -p "$OUT" /tmp/zc
ln -sfn "$ROOT" /tmp/zc/zerocomm
export PYTHONPATH=/tmp/zc${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
started=$(date +%s)

{
  echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  "$PY" - <<'EOF' 2>&1
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "devices", torch.cuda.device_count())
print("nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
for name in ("cupy", "numpy", "tabulate", "mpi4py", "pytest", "pytest_timeout"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as exc:
        print(name, "MISSING", type(exc).__name__, exc)
import zerocomm, zerocomm.comm, zerocomm.ops.onebit_kernels as k
print("zerocomm", zerocomm.__file__, "C 1-bit kernels:", k.NATIVE is not None)
EOF
} | tee "$OUT/env.log"

echo "== zerocomm-bench gpu (at most ${BENCH_S} s)"
timeout -s INT "$BENCH_S" "$PY" -m zerocomm.benchmarks gpu --tests skip --timeout 150 --json "$OUT/gpu.json" \
  > "$OUT/bench.log" 2>&1
echo "zerocomm-bench gpu exit status $? after $(( $(date +%s) - started )) s"

echo "== CUDA tests (at most ${TESTS_S} s)"
timeout -s INT "$TESTS_S" "$PY" -m pytest -p no:cacheprovider -q -rfEs --timeout 300 \
  tests/ops/test_onebit_kernels.py tests/ops/test_onebit.py tests/ops/test_reduce.py tests/ops/test_quantize.py \
  tests/comm/test_nccl.py \
  tests/comm/test_cuda_staging.py tests/zero/test_zero_api_cuda.py tests/zero/test_zero_cuda.py \
  -k "cuda or nccl or cupy or gpu" --junitxml="$OUT/cuda-tests.xml" > "$OUT/cuda-tests.log" 2>&1
echo "pytest exit status $? after $(( $(date +%s) - started )) s"

{
  if [ -f "$OUT/cuda-tests.xml" ]; then
    "$PY" -m zerocomm.benchmarks gpu --sections tests --tests "$OUT/cuda-tests.xml" 2>&1 | grep -v "^# "
  else
    echo "no junit report; the end of the test log:"; tail -c 3000 "$OUT/cuda-tests.log"
  fi
  grep -E "^(FAILED|ERROR)" "$OUT/cuda-tests.log" | cut -c1-400 | head -20
} > "$OUT/summary.log" 2>&1
tail -c 2500 "$OUT/cuda-tests.log" | grep -E "passed|failed|error" | tail -3
cat "$OUT/summary.log"
echo "== benchmark"
cat "$OUT/bench.log"
echo "== done after $(( $(date +%s) - started )) s"
