"""GEAR v0, this library's earlier reading (spec v2.0; kept so that earlier results reproduce): the GRPO advantage
redistributed over segments anchored at mean + k_sigma·std spikes of the reverse KL, 1 + alpha·tanh weights
normalised to mean 1, not sign-aware. The paper's reading is configs/gear.py. Knobs: config.credit.gear_v0.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/gear_v0"
  c.credit.method = "gear_v0"
  return c
