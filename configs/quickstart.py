"""Quickstart: warm start then TRACE + GRPO on arithmetic tool-use tasks with SmolLM2-135M-Instruct.

The warm start's demonstrations mostly answer without the calculator (`env.arithmetic.direct_answer_prob = 0.8`,
as warm-start data from a model that skips its tool would), so the policy it leaves answers in its head and gets
few right; the 8 rollouts of an RL step sample the calculator now and then, those are the ones that pay, and RL
learns to call it. Held-out success goes from near 0 after the warm start to most of the 64 held-out tasks after 6
RL steps (docs/getting-started.md, "Quickstart numbers"); each RL row's `contrast_group_frac` is the share of
groups with an outcome contrast (a success and a failure), the groups GRPO learns from.

Sized for a 2-core CPU (about 6-7 minutes): 10 warm-start steps, 8 rollouts per RL step (2 prompts x 4), up to
2 tool turns of 48 new tokens, 6 RL steps, four evals on 64 held-out tasks (before and after the warm start, after
RL steps 3 and 6).

  jaxcredit train --config configs/quickstart.py
  jaxcredit train --config configs/quickstart.py --config.total_steps=7   # one more step, resumed
  jaxcredit viz --workdir runs/quickstart --methods trace,grpo,gear,crest   # the credit viewer, four tabs
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/quickstart"
  c.credit.method = "trace"
  c.env.arithmetic.direct_answer_prob = 0.8
  c.eval.every = 3
  # Rollout samples at RL steps 3 and 6 (one prompt group each, with every pass output): the credit viewer's pages
  # are written at the end (runs/quickstart/viewer/step_6/index.html); `jaxcredit viz` adds other methods.
  c.log_rollouts_every = 3
  return c
