"""HSD on the quickstart task: GRPO plus a dense term from the policy conditioned on a successful peer rollout of
the same group (its transcript, then the gold answer; no peer: the gold answer alone, or
--config.credit.hsd.fallback=skip). Knobs: config.credit.hsd.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/hsd"
  c.credit.method = "hsd"
  return c
