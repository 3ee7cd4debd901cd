"""Command line: `jaxcredit COMMAND ...`.

  train    --config configs/X.py [--config.key=value ...]: warm start (unless the workdir already has it), then
           RL; rerunning resumes from the latest checkpoint
  sft      --config configs/X.py [...]: the supervised warm start alone (a later `train` goes straight to RL)
  convert  --hf DIR | --gguf FILE, --out DIR [--dtype bf16|f32|f16]: a converted checkpoint (streamed)
  export   --checkpoint DIR --out DIR: Hugging Face safetensors + config.json from a converted checkpoint
  eval     --config configs/X.py [--model SOURCE] [--out DIR] [--samples K]: a model (any `model.source`, a
           training workdir or WORKDIR@STEP) on the held-out split with the trainer's eval; eval.json with 95%
           intervals and rollouts.jsonl; rerunning resumes
  credit   --config configs/X.py --in rollouts.jsonl --out credited.jsonl: the config's method's advantages for
           rollouts made elsewhere (docs/rollouts-jsonl.md), running the passes it needs with the config's models
  plan     --config configs/X.py --topology v5p:4x4x4 --mesh fsdp=N,tensor=M[,expert=E]: compile the training
           step ahead of time for a TPU topology (libtpu, no TPU needed) and print memory, FLOPs and MFU
  viz      --workdir W [--step N] [--methods trace,grpo,...] [--out DIR]: the credit viewer, one static HTML page
           per sampled rollout with every method's advantages on its tokens (docs/viewer.md)
  compare  W1 W2 ... [--out DIR]: learning curves of several runs overlaid, seeds of one setting as a band; or
           EVAL_A EVAL_B ...: `jaxcredit eval` folders of the same tasks, B - A per metric and per category with a
           paired 95% interval over the tasks

Each command is one row of COMMANDS: (argument synopsis, summary, handler(command, args) -> exit code).
Exit codes: 0 done, 1 the run failed, 2 bad usage or input (one line on stderr, nothing left half-written).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Callable, NamedTuple


class Command(NamedTuple):
  synopsis: str
  summary: str
  run: Callable[[str, list[str]], int]


def _usage() -> str:
  lines = ["usage: jaxcredit COMMAND ARGS", "", "commands:"]
  for name, command in COMMANDS.items():
    lines += [f"  {name:9s}{command.summary}", f"  {'':9s}  jaxcredit {name} {command.synopsis}"]
  return "\n".join(lines)


def _config_path(args: list[str]) -> str | None:
  for i, a in enumerate(args):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(args):
      return args[i + 1]
  return None


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    return 0 if len(argv) >= 2 else 2
  command = argv[1]
  if command not in COMMANDS:
    print(f"jaxcredit: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
    return 2
  if command in ("convert", "export"):
    # Host-side work: never start a TPU runtime (libtpu may be installed), and turn SIGTERM into SystemExit so
    # that the half-written output folder is removed as on Ctrl-C.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
  return COMMANDS[command].run(command, argv[2:])


def _command_help(command: str) -> str:
  entry = COMMANDS[command]
  lines = [
    f"usage: jaxcredit {command} {entry.synopsis}",
    "",
    entry.summary,
    "",
    "With --config, --help lists that config's keys, their values (overrides applied) and what each means:",
    f"  jaxcredit {command} --config configs/quickstart.py --help",
  ]
  if os.path.isdir("configs"):
    names = sorted(n for n in os.listdir("configs") if n.endswith(".py") and not n.startswith("_"))
    lines += ["", "configs here: " + ", ".join(f"configs/{n}" for n in names)]
  return "\n".join(lines)


def _wants_help(args: list[str]) -> bool:
  return any(a in ("-h", "--help") for a in args)


def _parse_config(path_and_overrides: list[str], command: str):
  """ml_collections' parse of `--config PATH` plus overrides (raises what it raises)."""
  from absl import flags
  from ml_collections import config_flags

  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, "experiment config file (configs/X.py)", flag_values=flag_values, lock_config=True
  )
  argv = [f"jaxcredit {command}"] + path_and_overrides
  saved_argv, sys.argv = sys.argv, argv  # ml_collections finds --config.key overrides in sys.argv
  try:
    flag_values(argv)
    return flag_values.config
  finally:
    sys.argv = saved_argv


def _bad_override(command: str, path: str | None, args: list[str], e: BaseException) -> str:
  """One line for a failed override: the unknown key and its closest match, or the bad value's message."""
  from jaxcredit.train import config_help

  try:
    base = _parse_config([f"--config={path}"], command) if path else None
  except Exception:  # noqa: BLE001 - the file itself is reported by the caller's message below
    base = None
  if base is not None:
    message = config_help.unknown_key_message(base, args)
    if message:
      return f"jaxcredit {command}: {message}"
  text = str(e.args[0]) if getattr(e, "args", None) else str(e)
  return f"jaxcredit {command}: bad config override: {' '.join(text.split())}"


def _load_config(command: str, args: list[str]):
  """The config file plus --config.key=value overrides, through ml_collections config flags; an int exit code
  (after printing one line) when they are bad, or 0 after printing the help (`--help`)."""
  wants_help = _wants_help(args)
  args = [a for a in args if a not in ("-h", "--help")]
  if not any(a == "--config" or a.startswith("--config=") for a in args):
    if wants_help:
      print(_command_help(command))
      return 0
    return _fail(command, f"--config is required\n\n{_command_help(command)}")

  path = _config_path(args)
  if path is not None and not os.path.isfile(path) and not os.path.isfile(path.split(":")[0]):
    return _fail(command, f"config file not found: {path}")

  from absl import flags

  try:
    config = _parse_config(args, command)
  except flags.Error as e:
    if "config." in str(e):  # an override ml_collections could not apply
      print(_bad_override(command, path, args, e), file=sys.stderr)
    else:
      print(f"jaxcredit {command}: {e}", file=sys.stderr)
    return 2
  except (KeyError, AttributeError, ValueError, TypeError) as e:
    print(_bad_override(command, path, args, e), file=sys.stderr)
    return 2
  except OSError as e:  # raised by the parse in some versions, on first access in others
    return _fail(command, f"cannot load the config file: {e}")
  if config is None:
    return _fail(command, f"--config is required\n\n{_command_help(command)}")
  if wants_help:
    from jaxcredit.train import config_help

    print(
      f"usage: jaxcredit {command} {COMMANDS[command].synopsis}\n\n{path}, every key (override any with "
      f"--config.KEY=VALUE):\n"
    )
    print(config_help.describe_config(config, path.split(":")[0] if path else None))
    return 0
  if path and "config_file" in config and not config.config_file:
    # Recorded in config.json: `jaxcredit viz` loads the file again for the rows it registers (METHODS, PASSES, ...).
    file, sep, arg = path.partition(":")
    config.config_file = os.path.abspath(file) + sep + arg
  return config


def _validate(command: str, config) -> int:
  """`config.validate` before a command does work: 0, or 2 after one line naming the config key and its value.
  (`plan` validates in `plan.run_plan`, once the simulated devices are set up; `viz` in `report.view_samples`, on
  the workdir's config.)"""
  from jaxcredit.train import config as config_lib

  try:
    config_lib.validate(config)
  except ValueError as e:
    return _fail(command, f"error: {_one_line(e)}")
  return 0


def _credit(command: str, args: list[str]) -> int:
  """credit: --in and --out, then the config arguments of `_load_config`."""
  split = _own_flags(command, args, ("--in", "--out"))
  if isinstance(split, int):
    return split
  own, rest = split
  paths = {f"--{k}": v for k, v in own.items()}
  if _wants_help(rest):
    return _load_config(command, rest)
  for key in ("--in", "--out"):
    if not paths.get(key) or paths[key].startswith("--"):
      return _fail(command, f"{key} needs a path\n\n{_usage()}")
  if not os.path.isfile(paths["--in"]):
    what = "is a directory, not a file" if os.path.isdir(paths["--in"]) else "not found"
    return _fail(command, f"--in {paths['--in']}: {what}")
  if os.path.isdir(paths["--out"]):
    return _fail(command, f"--out {paths['--out']} is a directory; give a file path")
  config = _load_config(command, rest)
  if isinstance(config, int):
    return config
  error = _validate(command, config)
  if error:
    return error
  from jaxcredit.train.commands import offline_credit

  from jaxcredit.output_lock import OutputBusyError, hold

  try:
    with hold(paths["--out"], "credit", is_file=True):
      info = offline_credit.credit_file(config, paths["--in"], paths["--out"])
  except OutputBusyError as e:
    return _fail(command, f"error: {e}")
  except (ValueError, OSError) as e:
    return _fail(command, f"error: {e}")
  print(
    f"[jaxcredit] {info['method']} advantages of {info['rollouts']} rollouts ({info['groups']} groups) -> "
    f"{paths['--out']}"
  )
  return 0


def _train(command: str, args: list[str]) -> int:
  """train / sft: see `_load_config` for the arguments."""
  config = _load_config(command, args)
  if isinstance(config, int):
    return config
  distributed = os.environ.get("JAXCREDIT_DISTRIBUTED") == "1"
  # Validation runs the method's credit functions once (`method_checks.check_knobs`), which starts the JAX backend:
  # under JAXCREDIT_DISTRIBUTED it waits until this process has joined the others.
  if not distributed and _validate(command, config):
    return 2
  if distributed:
    error = _convert_before_joining(config) or _initialize_distributed()
    if error:
      return _fail(command, f"error: {error}")
    if _validate(command, config):
      return 2
  from jaxcredit.envs.spec import EnvironmentUnavailable
  from jaxcredit.output_lock import OutputBusyError
  from jaxcredit.train.tables.engines import EngineError
  from jaxcredit.train.loop.run import TrainingStopped
  from jaxcredit.train.commands import trainer
  from jaxcredit.train.loop.checkpoint import WorkdirRefused

  try:
    trainer.train(config, sft_only=(command == "sft"))
  except (OutputBusyError, WorkdirRefused) as e:  # refused inputs: exit 2, as a bad config key
    return _fail(command, f"error: {e}")
  except (
    ValueError,
    NotImplementedError,
    FileNotFoundError,
    FloatingPointError,
    EngineError,
    EnvironmentUnavailable,
  ) as e:
    return _fail(command, f"error: {e}", 1)
  except TrainingStopped as e:  # SIGTERM (preemption) or Ctrl-C during RL: the step was checkpointed
    print(f"jaxcredit {command}: {e}", file=sys.stderr)
    return 0 if e.signum == signal.SIGTERM else 130
  except KeyboardInterrupt:
    print(f"\njaxcredit {command}: interrupted; {_last_checkpoint(config.workdir)}", file=sys.stderr)
    return 130
  return 0


DISTRIBUTED_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
"""With JAXCREDIT_DISTRIBUTED=1: where the coordinator is, how many processes and which one this is. On a TPU VM
(or SLURM, Open MPI, Kubernetes) leave them unset: `jax.distributed.initialize` finds them itself."""


def _convert_before_joining(config) -> str | None:
  """Converts the policy's (and a teacher checkpoint's) source into the conversion cache in a child process on the
  CPU, before this process joins the distributed runtime: under `jax.distributed` orbax writes parameters from
  process 0 only, so every host converts its own copy first (concurrent conversions into a shared cache are
  atomic). Returns an error message, or None."""
  import subprocess

  from jaxcredit.train.tables.methods import METHODS

  sources = [config.model.source]
  method = METHODS.get(config.credit.method)  # an unknown name is refused by the validation that follows
  teacher = (config.teacher.source or method.teacher) if method else None
  if method and method.teacher is not None and teacher not in ("policy", "reference"):
    sources.append(teacher)
  code = (
    "import sys\n"
    "from jaxcredit.models import ensure_converted, resolve_source\n"
    "for s in sys.argv[2:]: ensure_converted(resolve_source(s), cache_dir=sys.argv[1] or None)\n"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code, config.model.cache_dir or "", *sources],
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
  )
  if proc.returncode:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return f"converting {sources} before joining the other processes failed: {lines[-1] if lines else proc.returncode}"
  return None


def _initialize_distributed() -> str | None:
  """`jax.distributed.initialize` from DISTRIBUTED_ENV where set (all three, or none: auto-detection); on CPU the
  collectives go through gloo. Returns an error message, or None."""
  import jax

  given = {k: os.environ[k] for k in DISTRIBUTED_ENV if os.environ.get(k)}
  if given and len(given) != len(DISTRIBUTED_ENV):
    missing = [k for k in DISTRIBUTED_ENV if k not in given]
    return f"JAXCREDIT_DISTRIBUTED=1 with {sorted(given)} set but {missing} unset: set all three or none"
  kwargs = {}
  if given:
    try:
      kwargs = {
        "coordinator_address": given["JAX_COORDINATOR_ADDRESS"],
        "num_processes": int(given["JAX_NUM_PROCESSES"]),
        "process_id": int(given["JAX_PROCESS_ID"]),
      }
    except ValueError:
      return f"JAX_NUM_PROCESSES={given['JAX_NUM_PROCESSES']!r} and JAX_PROCESS_ID={given['JAX_PROCESS_ID']!r} must be integers"
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  return None


def _last_checkpoint(workdir: str) -> str:
  """Where a rerun of the same command resumes from, in words."""
  from jaxcredit.train.loop.checkpoint import saved_steps

  directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
  steps = saved_steps(workdir)
  if not steps:
    return f"no checkpoint yet in {directory}; a rerun starts over"
  return (
    f"the last checkpoint is RL step {steps[-1]} in {directory} (step 0: the warm start); the same command "
    f"resumes from it"
  )


class _UsageError(Exception):
  pass


class _Parser(argparse.ArgumentParser):
  """argparse that raises instead of printing usage and exiting, so that a mistake is reported on one line."""

  def error(self, message):
    raise _UsageError(message)


def _parse(command: str, args: list[str], build: Callable[[argparse.ArgumentParser], None]):
  parser = _Parser(prog=f"jaxcredit {command}", description=COMMANDS[command].summary)
  build(parser)
  if any(a in ("-h", "--help") for a in args):
    parser.print_help()
    return None
  return parser.parse_args(args)


def _parse_or_exit(command: str, args: list[str], build: Callable[[argparse.ArgumentParser], None]):
  """`_parse`, or the command's exit code: 0 after --help, 2 after a usage error printed on one line."""
  try:
    ns = _parse(command, args, build)
  except _UsageError as e:
    return _fail(command, str(e))
  return 0 if ns is None else ns


def _checkpoint_command(
  command: str, args: list[str], build: Callable[[argparse.ArgumentParser], None], run: Callable[..., str]
) -> int:
  """convert and export: parse, `run(namespace)` (the work; returns the summary line), print the summary. A usage
  error, ValueError or OSError (missing, unreadable or existing paths) is one line `error: ...`, exit 2."""
  try:
    ns = _parse(command, args, build)
    if ns is None:
      return 0
    summary = run(ns)
  except (_UsageError, ValueError, OSError) as e:
    return _fail(command, f"error: {_one_line(e)}")
  print(summary)
  return 0


MAX_SIMULATED_CHIPS = 512
"""`plan` without libtpu simulates the chips with CPU devices; far more (v5p:16x16x24's 6,144) ended in XLA's
"Multiprocess computations aren't implemented on the CPU backend"."""


def _fail(command: str, message: str, code: int = 2) -> int:
  """Prints `jaxcredit COMMAND: message` on stderr and returns the exit code (2: the command refused)."""
  print(f"jaxcredit {command}: {message}", file=sys.stderr)
  return code


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split())


def _mib(n: int | None) -> str:
  return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def _convert(command: str, args: list[str]) -> int:
  """convert: an HF folder or a GGUF file into a converted checkpoint; prints a tqdm bar and a summary line."""

  def build(p):
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
      "--hf",
      metavar="DIR",
      help="Hugging Face folder (config.json + safetensors (+ index)) or a Hub id org/name[@revision]",
    )
    source.add_argument("--gguf", metavar="FILE", help="llama.cpp GGUF file (llama, qwen3)")
    p.add_argument("--out", metavar="DIR", required=True, help="the converted checkpoint folder to create")
    p.add_argument(
      "--dtype",
      default=None,
      help="store parameters in this dtype (bf16, f32, f16); default: the source's (float32 for GGUF)",
    )

  def run(ns) -> str:
    from jaxcredit.models import hf, resolve_source

    convert = hf.convert_hf if ns.hf is not None else hf.convert_gguf
    stats = convert(resolve_source(ns.hf) if ns.hf is not None else ns.gguf, ns.out, dtype=ns.dtype, progress=True)
    return (
      f"converted {stats['tensors']} tensors ({_mib(stats['bytes_read'])} read) into {stats['out']} in "
      f"{stats['seconds']:.1f} s; peak memory above baseline {_mib(stats['peak_rss_above_baseline_bytes'])}, "
      f"largest input shard {_mib(stats['largest_shard_bytes'])}"
    )

  return _checkpoint_command(command, args, build, run)


def _export(command: str, args: list[str]) -> int:
  """export: a converted checkpoint back to HF safetensors + config.json."""

  def build(p):
    p.add_argument("--checkpoint", metavar="DIR", required=True, help="a converted checkpoint folder")
    p.add_argument("--out", metavar="DIR", required=True, help="the Hugging Face folder to create")
    p.add_argument(
      "--max-shard-size",
      type=float,
      default=5.0,
      metavar="GB",
      help="shard size limit in GiB when the source's shard layout is unknown (default 5)",
    )
    p.add_argument(
      "--untie-embeddings",
      action="store_true",
      help="write a tied output head as its own lm_head.weight (config tie_word_embeddings: false), for a vLLM "
      "server that rollout.engine=vllm syncs weights into (docs/engines.md)",
    )

  def run(ns) -> str:
    from jaxcredit.models import hf

    stats = hf.export_hf(
      ns.checkpoint,
      ns.out,
      max_shard_size=int(ns.max_shard_size * 2**30),
      progress=True,
      untie_embeddings=ns.untie_embeddings,
    )
    return (
      f"exported {stats['tensors']} tensors in {stats['files']} file(s), {_mib(stats['bytes_written'])}, "
      f"into {stats['out']} in {stats['seconds']:.1f} s"
    )

  return _checkpoint_command(command, args, build, run)


def _own_flags(command: str, args: list[str], names: tuple[str, ...]) -> tuple[dict[str, str], list[str]] | int:
  """Splits `--name VALUE` / `--name=VALUE` of `names` from the config arguments; 2 after one line when one lacks
  its value."""
  own: dict[str, str] = {}
  rest: list[str] = []
  i = 0
  while i < len(args):
    name, eq, value = args[i].partition("=")
    if name in names:
      if not eq:
        if i + 1 >= len(args) or args[i + 1].startswith("--"):
          return _fail(command, f"{name} needs a value")
        value, i = args[i + 1], i + 1
      own[name[2:]] = value
    else:
      rest.append(args[i])
    i += 1
  return own, rest


def _default_eval_dir(config, model: str | None) -> str:
  """eval/<model>_<env>: the model source's last path part (a Hub id's name, a workdir with its @step)."""
  import re

  source = str(config.model.source if model is None else model).rstrip("/")
  name = re.sub(r"[^A-Za-z0-9._@-]+", "_", os.path.basename(source) or source)
  return os.path.join("eval", f"{name}_{config.env.name}")


def _eval(command: str, args: list[str]) -> int:
  """eval: --model, --out and --samples are ours; the rest is the config and its overrides."""
  split = _own_flags(command, args, ("--model", "--out", "--samples"))
  if isinstance(split, int):
    return split
  own, rest = split
  if _wants_help(args) and not any(a == "--config" or a.startswith("--config=") for a in rest):
    print(
      _command_help(command) + "\n\n  --model    what to evaluate: a Hugging Face folder or Hub id, a GGUF file, a "
      "converted checkpoint,\n             a training workdir (its last checkpoint) or WORKDIR@STEP; default: "
      "config.model.source\n  --out      the folder of eval.json and rollouts.jsonl (default eval/<model>_<env>); "
      "an\n             interrupted eval there resumes\n  --samples  K rollouts per task at the rollouts' "
      "temperature: pass@K and mean@K (default 1:\n             greedy, config.eval.greedy)"
    )
    return 0
  try:
    samples = int(own.get("samples", "1"))
  except ValueError:
    samples = 0
  if samples < 1:
    return _fail(command, f"--samples must be an integer >= 1, got {own['samples']!r}")
  config = _load_config(command, rest)
  if isinstance(config, int):
    return config
  if _validate(command, config):
    return 2
  model = own.get("model") or None
  out = own.get("out") or _default_eval_dir(config, model)
  if os.path.isfile(out):
    return _fail(command, f"--out {out} is a file; give a folder")
  from jaxcredit.envs.spec import EnvironmentUnavailable
  from jaxcredit.output_lock import OutputBusyError
  from jaxcredit.train.tables.engines import EngineError
  from jaxcredit.train.commands import evaluate

  try:
    info = evaluate.evaluate_model(config, model=model, out_dir=out, samples=samples)
  except OutputBusyError as e:
    return _fail(command, f"error: {e}")
  except (ValueError, OSError) as e:  # OSError: a missing model, an unreadable folder
    return _fail(command, f"error: {_one_line(e)}")
  except (EngineError, EnvironmentUnavailable) as e:
    return _fail(command, f"error: {e}", 1)
  except KeyboardInterrupt:
    print(f"\njaxcredit {command}: interrupted; the same command resumes from {out}/rollouts.jsonl", file=sys.stderr)
    return 130
  decoding = (
    "greedy" if info["decoding"]["greedy"] else f"{samples} sample(s) at temperature {config.sampling.temperature}"
  )
  print(
    f"[jaxcredit] eval of {info['model']} on {len(info['task_ids'])} held-out tasks of {config.env.name} "
    f"({decoding}; {info['sampled']} rollouts sampled, {info['resumed']} resumed) -> {out}/eval.json"
  )
  print(evaluate.format_table(info))
  return 0


def _viz(command: str, args: list[str]) -> int:
  """viz: the credit viewer's pages for a workdir's rollout samples (jaxcredit.train.commands.report.view_samples)."""

  def build(p):
    p.add_argument("--workdir", required=True, help="a training workdir with rollout_samples/ (log_rollouts_every)")
    p.add_argument("--step", type=int, default=None, help="RL step of the samples (default: the latest)")
    p.add_argument(
      "--methods",
      default=None,
      help="comma-separated methods, one tab each (default: the trained method, then grpo); others are computed "
      "on the same rollouts with the workdir's latest checkpoint",
    )
    p.add_argument("--out", default=None, help="output folder (default: WORKDIR/viewer/step_N)")
    p.add_argument(
      "--rollouts",
      default=None,
      metavar="FILE",
      help="a rollouts JSONL file to show instead of the samples (e.g. DIR/rollouts.jsonl of `jaxcredit eval "
      "--samples K`), credited with the workdir's config and latest checkpoint",
    )

  a = _parse_or_exit(command, args, build)
  if isinstance(a, int):
    return a
  if not os.path.isdir(a.workdir):
    return _fail(command, f"--workdir {a.workdir}: not a directory")
  methods = None if a.methods is None else list(dict.fromkeys(m.strip() for m in a.methods.split(",") if m.strip()))
  if methods is not None and not methods:
    return _fail(command, "--methods names no method")
  from jaxcredit.train.commands import report

  try:
    info = report.view_samples(a.workdir, step=a.step, methods=methods, out_dir=a.out, rollouts=a.rollouts)
  except (ValueError, OSError) as e:
    return _fail(command, f"error: {_one_line(e)}")
  where = f"step {info['step']}" if info["step"] is not None else a.rollouts
  print(
    f"[jaxcredit] credit viewer: {info['rollouts']} rollouts of {where}, methods "
    f"{', '.join(info['methods'])} -> {info['index']}"
  )
  return 0


def _compare(command: str, args: list[str]) -> int:
  """compare: learning curves of several workdirs (jaxcredit.viz.compare.compare_runs), or B - A of eval folders
  with paired intervals (jaxcredit.viz.compare_evals.compare_evals); never a mix of the two."""

  def build(p):
    p.add_argument(
      "workdirs",
      nargs="+",
      help="training workdirs (metrics.jsonl, config.json), or `jaxcredit eval` folders (eval.json) of the same "
      "tasks: each compared with the first",
    )
    p.add_argument("--out", default="compare", help="output folder (default: ./compare)")

  a = _parse_or_exit(command, args, build)
  if isinstance(a, int):
    return a
  from jaxcredit.viz import compare_evals

  evals = [w for w in a.workdirs if compare_evals.is_eval_folder(w)]
  if evals and len(evals) < len(a.workdirs):
    runs = [w for w in a.workdirs if w not in evals]
    print(
      f"jaxcredit {command}: cannot mix eval folders ({', '.join(evals)}) with training runs or other folders "
      f"({', '.join(runs)}): give only `jaxcredit eval` folders, or only training workdirs",
      file=sys.stderr,
    )
    return 2
  if evals:
    try:
      info = compare_evals.compare_evals(evals, a.out)
    except (ValueError, OSError) as e:
      return _fail(command, f"error: {_one_line(e)}")
    print(compare_evals.format_comparison(info))
    print(f"[jaxcredit] compare: {info['json']} (intervals: {info['interval']})")
    return 0
  from jaxcredit.viz.compare import compare_runs

  try:
    info = compare_runs(a.workdirs, a.out)
  except (ValueError, OSError) as e:
    return _fail(command, f"error: {_one_line(e)}")
  for g in info["groups"]:
    final = g["final"].get("rl/success_rate")
    tail = f", success {final['mean']:.3f} at step {final['step']}" if final else ""
    print(f"  {g['label']}: {len(g['seeds'])} run(s){tail}")
  print(f"[jaxcredit] compare: {info['png']}, {info['html']}")
  return 0


def _plan(command: str, args: list[str]) -> int:
  """plan: --topology and --mesh (and --json FILE) are ours; the rest is the config and its overrides."""
  split = _own_flags(command, args, ("--topology", "--mesh", "--json"))
  if isinstance(split, int):
    return split
  own, rest = split
  if _wants_help(args):
    if not any(a == "--config" or a.startswith("--config=") for a in rest):
      print(
        _command_help(command)
        + "\n\n  --topology  a TPU topology, e.g. v5p:4x4x4 or v5e:4x4 (default: config.plan.topology)\n"
        "  --mesh      mesh axis sizes, e.g. fsdp=16,tensor=4; `data` takes the chips the named axes leave\n"
        "  --json      also write the report to this file\n\n"
        "  libtpu: TPU_LIBRARY_PATH (python tools/install_libtpu.py installs one into .libtpu) or the `tpu`\n"
        "  extra; without it the step compiles for simulated CPU devices and the report says it is an estimate"
      )
      return 0
    return _load_config(command, rest)
  from jaxcredit.train.commands.plan import (
    libtpu_library_path,
    parse_mesh,
    parse_topology,
  )  # no jax backend starts before the XLA_FLAGS below

  config = _load_config(command, rest)
  if isinstance(config, int):
    return config
  # The pod: the flags, else the one the config states (config.plan.topology / config.plan.mesh).
  own.setdefault("topology", config.plan.topology)
  if "mesh" not in own or not own["mesh"]:
    own["mesh"] = config.plan.mesh
  if not own["topology"]:
    return _fail(command, "--topology is required (e.g. v5p:4x4x4), or config.plan.topology in the config")
  try:
    _, chips = parse_topology(own["topology"])
    parse_mesh(own["mesh"])
  except ValueError as e:
    return _fail(command, str(e))
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # deviceless: the TPU is described by libtpu, not attached
  if libtpu_library_path() is None:
    if chips > MAX_SIMULATED_CHIPS:
      return _fail(
        command,
        f"--topology {own['topology']} has {chips} chips: without libtpu the plan simulates them with CPU devices, "
        f"at most {MAX_SIMULATED_CHIPS}; install libtpu (python tools/install_libtpu.py, or TPU_LIBRARY_PATH) to "
        "compile for it deviceless",
      )
    # Fallback: simulate the chips with CPU devices (read when the backend starts, which has not happened yet).
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={chips}"
    ).strip()
  json_file = None
  if "json" in own:  # opened before the compile, so that a bad path costs nothing
    try:
      json_file = open(own["json"], "w")
    except OSError as e:
      return _fail(command, f"cannot write --json {own['json']}: {_one_line(e)}")
  from jaxcredit.train.commands import plan

  try:
    report = plan.run_plan(config, own["topology"], own["mesh"])
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxcredit plan: error: {_one_line(e)}", file=sys.stderr)
    if json_file is not None:
      json_file.close()
      os.remove(own["json"])
    return 2
  if json_file is not None:
    import json

    with json_file:
      json.dump(report, json_file, indent=1)
  return 0


COMMANDS: dict[str, Command] = {
  "train": Command(
    "--config configs/X.py [--config.key=value ...]",
    "warm start (once), then RL with the configured credit method; resumable",
    _train,
  ),
  "sft": Command(
    "--config configs/X.py [--config.key=value ...]",
    "only the supervised warm start; leaves a checkpoint that `train` resumes from",
    _train,
  ),
  "convert": Command(
    "--hf DIR | --gguf FILE --out DIR [--dtype bf16|f32|f16]",
    "convert a Hugging Face folder or a GGUF file into a converted checkpoint (streamed)",
    _convert,
  ),
  "export": Command(
    "--checkpoint DIR --out DIR [--max-shard-size GB]",
    "write a converted checkpoint as Hugging Face safetensors + config.json",
    _export,
  ),
  "eval": Command(
    "--config configs/X.py [--model SOURCE] [--out DIR] [--samples K] [--config.key=value ...]",
    "a model or checkpoint on the held-out split: the trainer's eval metrics with 95% intervals; resumable",
    _eval,
  ),
  "credit": Command(
    "--config configs/X.py --in rollouts.jsonl --out credited.jsonl [--config.key=value ...]",
    "the method's advantages for rollouts made elsewhere (JSONL; groups from group ids)",
    _credit,
  ),
  "plan": Command(
    "--config configs/X.py --topology v5p:4x4x4 [--mesh fsdp=N,tensor=M,expert=E] [--json FILE]",
    "compile the training step for a TPU topology without a TPU: memory per chip, FLOPs, MFU",
    _plan,
  ),
  "viz": Command(
    "--workdir W [--step N | --rollouts FILE] [--methods trace,grpo,...] [--out DIR]",
    "the credit viewer: static HTML pages, every action token coloured by its advantage under each method",
    _viz,
  ),
  "compare": Command(
    "W1 W2 ... | EVAL_A EVAL_B ... [--out DIR]",
    "learning curves of several runs overlaid (mean and band over seeds), PNG + JSON + HTML; or eval folders of "
    "the same tasks: B - A per metric and category with a paired 95% interval",
    _compare,
  ),
}


if __name__ == "__main__":
  sys.exit(main())
