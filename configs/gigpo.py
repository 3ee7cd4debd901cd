"""GiGPO baseline on the quickstart task: the episode advantage plus a step advantage among turns of the group
taken in the same state (a hash of the preceding observation; --config.credit.gigpo.state_key=history for the
whole context). Knobs: config.credit.gigpo.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/gigpo"
  c.credit.method = "gigpo"
  return c
