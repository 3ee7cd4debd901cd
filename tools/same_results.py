"""Do two checkouts train the same? Every method's tiny run (the test suite's tiny random policy on the quickstart
task, `tests/fixtures/tiny_run.py`, 2 RL steps; `warm_<config>`: after a 4-step warm start with an eval every 2) in each
checkout, then every key of every metrics row compared
(timings left out), and every rollout file the runs export (`rollout.export_jsonl`, the viewer's samples with pass
outputs and credit details) compared line by line. For a refactor that must not change results (issue 55).

  git worktree add /tmp/before <commit>        # or git clone + checkout
  python tools/same_results.py /tmp/before . --methods trace,crest,toolopd,hsd,hsd_grpo,sgcd,gear,warm_grpo

Prints one line per method ("same" or the first differences) and exits 1 when any differs. Each checkout runs in its
own process with that checkout first on sys.path; the tiny GGUF and each checkout's conversion and XLA caches go to
--work (default a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_RUN = r"""
import json, os, sys
root, out, methods = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
sys.path.insert(0, root)
os.chdir(root)
from tests.fixtures.tiny_model import CFG, random_params, write_gguf
from tests.fixtures.tiny_run import TinyModel, metrics_rows, tiny_run_config
try:
  from jaxcredit.train.commands import trainer
except ImportError:  # a checkout before train/ was grouped (issue 55)
  from jaxcredit.train import trainer

gguf = os.path.join(os.path.dirname(out), "tiny.gguf")
if not os.path.isfile(gguf):
  write_gguf(gguf, "llama", CFG, random_params(CFG))
tiny = TinyModel(gguf, os.path.join(out, "converted"), os.path.join(out, "xla"))
rows, exports = {}, {}
for name in methods:
  workdir = os.path.join(out, name)
  config, warm = (name[len("warm_"):], {"sft__steps": 4, "eval__sft_every": 2}) if name.startswith("warm_") else (name, {})
  c = tiny_run_config(config, workdir, tiny, teacher__max_len=2048, total_steps=2, **warm)
  if c.credit.method == "toolopd":
    c.credit.toolopd.skill_max_tokens = 4
  if c.credit.method in ("sgcd", "sgcd_v0"):  # the tiny policy never succeeds: no group is mixed
    c.credit[c.credit.method].summary_max_tokens = 4
    c.credit[c.credit.method].mixed_groups = "keep"
  c.rollout.export_jsonl = True
  c.log_rollouts_every = 1
  trainer.train(c)
  rows[name] = metrics_rows(workdir)  # every phase: the warm start's, the evals', the RL steps'

  exports[name] = {}
  for folder in ("rollouts", "rollout_samples"):
    for f in sorted(os.listdir(os.path.join(workdir, folder))):
      with open(os.path.join(workdir, folder, f)) as fh:
        exports[name][folder + "/" + f] = fh.read().splitlines()
with open(os.path.join(out, "rows.json"), "w") as f:
  json.dump({"rows": rows, "exports": exports}, f)
"""


def timing(key: str) -> bool:
  """Keys that measure time (they differ between any two runs)."""
  return key.endswith("_s") or key.endswith("seconds") or "per_s" in key


def differences(before: list[dict], after: list[dict]) -> list[str]:
  """'step N key: before -> after' for every non-timing key whose value differs (rows in order)."""
  out = []
  if len(before) != len(after):
    out.append(f"{len(before)} rows before, {len(after)} after")
  for a, b in zip(before, after):
    for key in sorted(set(a) | set(b)):
      if not timing(key) and a.get(key, "<missing>") != b.get(key, "<missing>"):
        out.append(f"step {a.get('step')} {key}: {a.get(key, '<missing>')!r} -> {b.get(key, '<missing>')!r}")
  return out


def export_differences(before: dict, after: dict) -> list[str]:
  """'FILE line N differs' for every exported rollout file whose lines differ (or that one side lacks)."""
  out = []
  for path in sorted(set(before) | set(after)):
    a, b = before.get(path), after.get(path)
    if a is None or b is None:
      out.append(f"{path} only {'after' if a is None else 'before'}")
      continue
    bad = [k for k, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b) or bad:
      out.append(f"{path}: {len(a)} -> {len(b)} lines, line(s) {bad[:3]} differ")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("before", help="a checkout of the earlier code")
  ap.add_argument("after", help="a checkout of the later code")
  ap.add_argument("--methods", default="trace,crest,toolopd,hsd,hsd_grpo,sgcd,gear", help="configs/<name>.py names")
  ap.add_argument("--work", default="", help="folder for the runs (default: a new temporary folder)")
  args = ap.parse_args(argv)
  work = args.work or tempfile.mkdtemp(prefix="same_results_")
  rows = {}
  for side, root in (("before", args.before), ("after", args.after)):
    out = os.path.join(work, side)
    os.makedirs(out, exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", _RUN, os.path.abspath(root), out, args.methods], text=True)
    if proc.returncode != 0:
      print(f"[same_results] the {side} checkout's runs failed (exit {proc.returncode})", file=sys.stderr)
      return 2
    with open(os.path.join(out, "rows.json")) as f:
      rows[side] = json.load(f)
  failed = False
  for name in args.methods.split(","):
    before, after = rows["before"], rows["after"]
    diff = differences(before["rows"][name], after["rows"][name])
    diff += export_differences(before["exports"][name], after["exports"][name])
    keys = len(after["rows"][name][0]) if after["rows"][name] else 0
    lines = sum(len(v) for v in after["exports"][name].values())
    print(
      f"{name}: "
      + ("same" if not diff else "DIFFERS: " + "; ".join(diff[:5]))
      + f" ({keys} keys a row, {lines} exported lines)"
    )
    failed |= bool(diff)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
