"""Command line: `jaxcredit train|sft --config configs/X.py [--config.key=value ...]`.

  train   warm start (unless the workdir already has it), then RL; rerunning resumes from the latest checkpoint
  sft     the supervised warm start alone (a later `train` with the same workdir goes straight to RL)
"""

from __future__ import annotations

import os
import sys

COMMANDS = {
    "train": "warm start (once), then RL with the configured credit method; resumable",
    "sft": "only the supervised warm start; leaves a checkpoint that `train` resumes from",
}


def _usage() -> str:
  lines = ["usage: jaxcredit COMMAND --config configs/X.py [--config.key=value ...]", "", "commands:"]
  lines += [f"  {k:8s}{v}" for k, v in COMMANDS.items()]
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

  if not any(a == "--config" or a.startswith("--config=") for a in argv[2:]):
    print(f"jaxcredit {command}: --config is required\n\n{_usage()}", file=sys.stderr)
    return 2

  path = _config_path(argv[2:])
  if path is not None and not os.path.isfile(path) and not os.path.isfile(path.split(":")[0]):
    print(f"jaxcredit {command}: config file not found: {path}", file=sys.stderr)
    return 2

  from absl import flags
  from ml_collections import config_flags

  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "experiment config file (configs/X.py)", flag_values=flag_values,
                                  lock_config=True)
  try:
    flag_values([f"jaxcredit {command}"] + argv[2:])
  except flags.Error as e:
    print(f"jaxcredit {command}: {e}", file=sys.stderr)
    return 2
  except (KeyError, AttributeError, ValueError, TypeError) as e:
    print(f"jaxcredit {command}: bad config override: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # raised here by some versions, on first access by others
    print(f"jaxcredit {command}: cannot load the config file: {e}", file=sys.stderr)
    return 2
  try:
    config = flag_values.config
  except OSError as e:
    print(f"jaxcredit {command}: cannot load the config file: {e}", file=sys.stderr)
    return 2
  if config is None:
    print(f"jaxcredit {command}: --config is required\n\n{_usage()}", file=sys.stderr)
    return 2

  if os.environ.get("JAXCREDIT_DISTRIBUTED") == "1":
    import jax

    jax.distributed.initialize()  # coordinator, process count and id from the TPU / cluster environment
  from jaxcredit.train import trainer

  try:
    trainer.train(config, sft_only=(command == "sft"))
  except (ValueError, NotImplementedError, FileNotFoundError, FloatingPointError) as e:
    print(f"jaxcredit {command}: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
