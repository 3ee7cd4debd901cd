"""SGCD on the quickstart task (arXiv 2606.12634, from its abstract and summaries): GRPO whose token advantages are
amplified, by W = clip(1 + gamma·s, 1, c) (gamma = 1, c = 2: never shrunk, never flipped), where a teacher (the
policy) shown a step-wise credit reference comparing a successful and a failed sibling of the same group departs
from the student; the policy itself never sees the reference. The paper's summariser is an external LLM; here the
teacher writes it, as a stand-in (docs/methods/sgcd.md gives the readings taken; the library's earlier reading:
configs/sgcd_v0.py). Groups without both outcomes leave the update
(credit.sgcd.mixed_groups="skip", counted as sgcd_groups_skipped) or train as GRPO ("keep"); with
--config.rollout.resample_tied_groups=N they are first replaced by groups with both outcomes from up to N fresh
prompt batches (dynamic sampling, counted as resampled_groups). Knobs:
config.credit.sgcd.*; a separate summariser (the paper's external LLM):
--config.credit.sgcd.summarizer=path/to/checkpoint (same tokenizer); a separate teacher: --config.teacher.source.

  jaxcredit train --config configs/sgcd.py
  jaxcredit viz --workdir runs/sgcd --methods sgcd,grpo   # the weights and the summary beside each rollout
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/sgcd"
  c.credit.method = "sgcd"
  # Rollout samples at RL steps 3 and 6 for the credit viewer (runs/sgcd/viewer/step_6/index.html).
  c.log_rollouts_every = 3
  return c
