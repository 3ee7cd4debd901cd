"""Quickstart: warm start then TRACE + GRPO on arithmetic tool-use tasks with SmolLM2-135M-Instruct.

Sized for a 2-core CPU (about 20 minutes): 10 warm-start steps, 8 rollouts per RL step
(2 prompts x 4), up to 2 tool turns of 48 new tokens, 6 RL steps, three evals on 64 held-out tasks.

  jaxcredit train --config configs/quickstart.py
  jaxcredit train --config configs/quickstart.py --config.total_steps=7   # one more step, resumed
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/quickstart"
  c.credit.method = "trace"
  return c
