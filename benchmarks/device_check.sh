#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU (the `gpu` extra: pip install -e ".[gpu]"): the model and
# sampler tests on the GPU, then a Qwen3-0.6B-sized RL step with random weights (benchmarks/device_step.py: the
# learner's tokens/s and MFU at the GPU's dense bf16 peak; a whole RL step synchronous against rollout.async_depth=1).
#
#   bash benchmarks/device_check.sh [OUT_DIR]        # JSON and logs into OUT_DIR (default: $OUT, else /tmp/device_check)
#   DEVICE_CHECK_TINY=1 bash benchmarks/device_check.sh OUT_DIR   # a tiny model on any backend (the CPU test)
#
# Writes OUT_DIR/device_check.json (device_step.py's results), OUT_DIR/tests.log, and OUT_DIR/devices.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/device_check}}"
mkdir -p "$out"
work="${DEVICE_CHECK_WORKDIR:-/tmp/device_check_work}"
python -c "import jax; print(jax.default_backend(), jax.devices())" | tee "$out/devices.txt"
tiny=()
tests=(tests/models tests/sampling)
if [[ "${DEVICE_CHECK_TINY:-0}" == "1" ]]; then
  tiny=(--tiny)
  tests=(tests/models/test_tokenizer.py)
fi
# The model and sampler tests on this backend (they pick the default device); a failure is reported, not fatal, so
# the step is still measured.
tests_rc=0
python -m pytest -q -x -p no:cacheprovider "${tests[@]}" > "$out/tests.log" 2>&1 || tests_rc=$?
tail -n 1 "$out/tests.log"
python benchmarks/device_step.py --out "$out/device_check.json" --workdir "$work" "${tiny[@]}"
echo "tests exit code: $tests_rc" | tee -a "$out/devices.txt"
exit "$tests_rc"
