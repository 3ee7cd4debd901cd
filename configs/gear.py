"""GEAR on the quickstart task (arXiv 2605.11853, from its summaries and captions): the GRPO advantage times a
sign-aware weight (1 − alpha·c on a success, 1 + alpha·c on a failure) of the normalised full-vocabulary reverse KL
between the policy and the policy shown the verified answer; segments open where it exceeds lambda_kl and end where
the policy's entropy exceeds lambda_h times the onset's (Table 2's defaults). Knobs: config.credit.gear.*; the
library's earlier reading: configs/gear_v0.py.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/gear"
  c.credit.method = "gear"
  return c
