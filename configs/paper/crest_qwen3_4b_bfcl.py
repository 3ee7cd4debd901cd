"""CrEST on Qwen3-4B, BFCL V3 multi-turn (each user request a verified unit), sized for a v5p-32 (16 chips,
fsdp=16).

Paper: Wang et al., "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit Assignment for Multi-Turn
Multi-step LLM Agents", arXiv 2608.13179 (docs/methods/crest.md).
The paper's (Sec. 4.1, App. C.1): the token-factor knobs (config.credit.crest: lam 0.3, clip_eps 0.28, tau 2.0, rho
0.5); the teacher, the fixed initial model (teacher.source "reference", the policy as RL starts), each request shown
the ground-truth tool-call results of the requests before it (budgets derived from the config, so none is cut);
32 sessions x 16 rollouts per step; Adam (0.9, 0.999), weight decay 0.01, gradient clip 1.0, learning rate 1e-6
constant; PPO clip 0.2 / 0.28; no KL; temperature 1.0; 160 steps; training on 100 Base sessions, evaluating on all
four categories (Base, Missing Functions, Missing Parameters, Long Context).
Ours: the held-out split is a hashed tenth of the four categories (84 sessions; the paper evaluates 400 and names
no ids), the 100 training sessions are drawn from Base's other 181, and a session's whole budget is 16k tokens
(the paper caps generation at 10k tokens). `jaxcredit plan` (libtpu, deviceless): peak 77.3 GiB of 95 per chip,
the sampler's KV cache 72.2 GiB of it. Qwen3-4B stands for the paper's Qwen3-4B-Instruct checkpoint (the same
shapes; --config.model.source=<its Hub id> trains it).

  jaxcredit plan --config configs/paper/crest_qwen3_4b_bfcl.py
"""

from jaxcredit.train.config import pod_config


def get_config():
  c = pod_config(
    method="crest", model="Qwen/Qwen3-4B", topology="v5p:2x2x4", mesh="fsdp=16", max_len=16384, prompts=32, group=16
  )
  c.env.name = "bfcl_multi_turn"
  c.env.num_train_tasks = 100  # the paper: 100 Base sessions
  c.env.bfcl_multi_turn.train_categories = "base"
  c.eval.num_tasks = 84  # every held-out session of the four categories
  # 16 assistant messages let ground-truth play finish every one of the 800 sessions (12 left 30 unwinnable: 2 base,
  # 13 miss_func, 13 miss_param, 2 long_context; `jaxcredit train` reports such tasks at start). Held-out sessions
  # take bfcl-eval's protocol (its decoder, 20 steps a request, no session cap: eval_max_turns 0).
  c.env.bfcl_multi_turn.max_turns = 16
  c.env.bfcl_multi_turn.max_steps_per_unit = 4
  c.env.bfcl_multi_turn.max_output_chars = 2000
  c.sampling.max_new_tokens = 1024
  c.sampling.temperature = 1.0
  c.optim.weight_decay = 0.01
  c.optim.max_grad_norm = 1.0
  c.loss.eps_low, c.loss.eps_high = 0.2, 0.28
  c.loss.kl_coef = 0.0
  c.total_steps = 160
  return c
