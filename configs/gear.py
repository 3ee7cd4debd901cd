"""GEAR on the quickstart task: the GRPO advantage redistributed over segments anchored at spikes of the
full-vocabulary reverse KL between the policy and the policy shown the verified answer. Knobs: config.credit.gear.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/gear"
  c.credit.method = "gear"
  return c
