"""SGCD v0, this library's earlier reading (spec v2.0; kept so that earlier results reproduce): GRPO's token
advantages times weights clip(1 + alpha (f / mean f − 1), w_min, w_max) of mean 1, so some tokens are shrunk (never
flipped). The paper's amplify-only reading is configs/sgcd.py. Knobs: config.credit.sgcd_v0.*.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/sgcd_v0"
  c.credit.method = "sgcd_v0"
  return c
