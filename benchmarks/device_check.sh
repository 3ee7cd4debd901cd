#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU, run on the image's own jax with the project read from the tree
# (docs/testing.md, "The GPU check"). The lent machine reaches no package index: what its image lacks travels as
# wheels in .whl/ (python tools/device_wheels.py, here), installed with no index into a folder of their own.
#   1. the first step (benchmarks/device_first_step.py): versions, imports and one tiny jitted step, within the first
#      minute; a failure stops the check there, its traceback in OUT_DIR/first_step.log;
#   2. the model and sampler tests on the GPU (bounded by DEVICE_CHECK_TEST_TIMEOUT seconds, default 240);
#   3. a Qwen3-0.6B-sized step with random weights (benchmarks/device_step.py): the learner's tokens/s and MFU at the
#      GPU's dense bf16 peak, decode throughput, a whole RL step synchronous against rollout.async_depth=1.
#
#   bash benchmarks/device_check.sh [OUT_DIR]        # default: $OUT, else /tmp/device_check
#   DEVICE_CHECK_TINY=1 bash benchmarks/device_check.sh OUT_DIR   # a tiny model on any backend (the CPU test)
#
# Writes OUT_DIR/first_step.json and .log, OUT_DIR/tests.log, OUT_DIR/device_check.json (device_step.py's results),
# OUT_DIR/device_step.log and OUT_DIR/summary.txt (versions, test tally, the step's numbers).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/device_check}}"
mkdir -p "$out"
work="${DEVICE_CHECK_WORKDIR:-/tmp/device_check_work}"
py="${PYTHON:-python3}"
started=$SECONDS
# The carried wheels, when present: no index, no dependency resolution, into their own folder, after the tree on
# the path so that nothing of the image is shadowed by a carried copy.
if compgen -G ".whl/*.whl" > /dev/null; then
  site="${DEVICE_CHECK_SITE:-/tmp/device_check_site}"
  "$py" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
  export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" benchmarks/device_first_step.py --out "$out/first_step.json" 2>&1 | tee "$out/first_step.log"
echo "[device_check] first step done at $((SECONDS - started)) s" | tee -a "$out/first_step.log"
tiny=()
tests=(tests/models tests/sampling)
if [[ "${DEVICE_CHECK_TINY:-0}" == "1" ]]; then
  tiny=(--tiny)
  tests=(tests/models/test_tokenizer.py)
fi
# The model and sampler tests on this backend (they pick the default device); a failure or the time limit is
# reported, not fatal, so the step is still measured.
tests_rc=0
timeout "${DEVICE_CHECK_TEST_TIMEOUT:-240}" "$py" -m pytest -q -p no:cacheprovider "${tests[@]}" > "$out/tests.log" 2>&1 \
  || tests_rc=$?
tail -n 1 "$out/tests.log"
"$py" benchmarks/device_step.py --out "$out/device_check.json" --workdir "$work" "${tiny[@]}" 2>&1 \
  | tee "$out/device_step.log"
{
  echo "seconds: $((SECONDS - started))"
  echo "tests exit code: $tests_rc ($(tail -n 1 "$out/tests.log"))"
  grep -h '^\[first step\] versions\|^\[first step\] backend\|^\[device_step\]' "$out/first_step.log" "$out/device_step.log"
} | tee "$out/summary.txt"
exit "$tests_rc"
