"""CrEST on BFCL V3 multi-turn: each user request of a session is a verified unit (BFCL's state and response
checkers), so CrEST's turn-segmented advantages credit each request's own tokens; the teacher is the paper's fixed
one (the policy as RL starts), each request shown the ground-truth calls of the requests before it and their results
(arXiv 2608.13179, App. C.1; --config.credit.crest.teacher_context=all shows every request the whole session's).
The teacher's budgets are derived from sampling.max_len (config.teacher.*: 0), so no ground truth is cut. Needs
bfcl-eval (`pip install --no-deps bfcl-eval mpmath`).

Sized for a first look on one host with SmolLM2-135M (whose success on BFCL is about 0: the point is that units are
verified and credited); on a pod, raise rollout.*, sampling.max_new_tokens and use a Qwen3 policy:

  jaxcredit train --config configs/crest_bfcl.py
  jaxcredit train --config configs/crest_bfcl.py --config.env.bfcl_multi_turn.categories=base,miss_param \\
      --config.credit.crest.lam=0.5
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/crest_bfcl"
  c.credit.method = "crest"
  c.env.name = "bfcl_multi_turn"
  c.env.num_train_tasks = 716  # the train split of the 800 tasks (eval: 84)
  c.env.bfcl_multi_turn.compact_tools = True  # tool descriptions without BFCL's repeated class paragraph
  # assistant messages per training session: short for one host, so ground-truth play cannot finish some training
  # sessions (`jaxcredit train` prints how many at start); held-out sessions take bfcl-eval's protocol (no session cap)
  c.env.bfcl_multi_turn.max_turns = 8
  c.env.bfcl_multi_turn.max_steps_per_unit = 2
  c.env.bfcl_multi_turn.max_output_chars = 400
  c.sampling.max_new_tokens = 96
  c.sampling.max_len = 6144  # prompts with the tools take 1.6k-4.3k SmolLM2 tokens
  c.train.length_bucket = 256
  c.sft.steps = 0  # demonstrations exist (the ground truth replayed), but are long
  c.eval.num_tasks = 16
  c.eval.batch_size = 8
  c.eval.before_sft = False
  c.eval.after_sft = False
  return c
