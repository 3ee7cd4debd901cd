"""Quickstart: warm start then TRACE + GRPO on arithmetic tool-use tasks with SmolLM2-135M-Instruct.

Sized for a 2-core CPU (about 5-6 minutes, measured 2026-12-06 in a fresh clone): 10 warm-start steps, 8 rollouts
per RL step (2 prompts x 4), up to 2 tool turns of 48 new tokens, 6 RL steps, three evals on 64 held-out tasks.

  jaxcredit train --config configs/quickstart.py
  jaxcredit train --config configs/quickstart.py --config.total_steps=7   # one more step, resumed
  jaxcredit viz --workdir runs/quickstart --methods trace,grpo,gear,crest   # the credit viewer, four tabs
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/quickstart"
  c.credit.method = "trace"
  # Rollout samples at RL steps 3 and 6 (one prompt group each, with every pass output): the credit viewer's pages
  # are written at the end (runs/quickstart/viewer/step_6/index.html); `jaxcredit viz` adds other methods.
  c.log_rollouts_every = 3
  return c
