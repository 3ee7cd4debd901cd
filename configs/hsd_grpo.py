"""HSD, this library's earlier reading (spec v2.0; kept so that earlier results reproduce): GRPO plus dense_coef
times the clipped log-ratio of the policy shown a successful peer rollout (then the gold answer) to the policy, on
the sampled token. The paper's objective is configs/hsd.py. Knobs: config.credit.hsd_grpo.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/hsd_grpo"
  c.credit.method = "hsd_grpo"
  return c
