"""HSD on the quickstart task, as its paper trains (arXiv 2606.15576, from its summaries): no reward term; the
full-vocabulary KL from the policy shown a successful peer rollout of the same group (its transcript, then the gold
answer; no peer: the gold answer alone, or --config.credit.hsd.fallback=skip) to the policy, plus beta KL to the
reference. HSD is a math/code paper; its use on tool calls is this library's extension. The earlier reading (GRPO
plus a clipped sampled-token log-ratio) is configs/hsd_grpo.py. Knobs: config.credit.hsd.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/hsd"
  c.credit.method = "hsd"
  return c
