"""The line printed when training starts: every phase, in order, with its size; resumes list only what is left."""

from jaxcredit.train.config import base_config
from jaxcredit.train.commands.trainer import run_overview


def config():
  c = base_config()
  c.workdir = "runs/x"
  c.total_steps = 6
  c.sft.steps = 10
  c.sft.batch_size = 4
  c.rollout.prompts_per_step, c.rollout.group_size = 2, 4
  return c


def test_a_fresh_run_lists_every_phase_with_its_size():
  assert run_overview(config(), resume_step=None, num_eval_tasks=64) == (
    "[jaxcredit] runs/x, fresh run: eval (64 held-out tasks) -> warm start (10 steps of 4 demonstrations) -> "
    "eval (64) -> RL steps 1-6 (6 x 8 rollouts, trace) -> eval (64)"
  )


def test_a_resume_lists_what_is_left_and_ppo_updates():
  c = config()
  c.train.ppo_epochs, c.train.mini_batch_size = 2, 4
  c.eval.at_end = False
  assert run_overview(c, resume_step=4, num_eval_tasks=64) == (
    "[jaxcredit] runs/x, resuming at RL step 4: RL steps 5-6 (2 x 8 rollouts, trace, 4 updates each)"
  )
  assert run_overview(c, resume_step=6, num_eval_tasks=64) == (
    "[jaxcredit] runs/x, resuming at RL step 6: RL: none left (checkpoint at step 6 of total_steps=6)"
  )


def test_sft_only_and_no_warm_start():
  c = config()
  assert run_overview(c, resume_step=None, num_eval_tasks=8, sft_only=True) == (
    "[jaxcredit] runs/x, fresh run: eval (8 held-out tasks) -> warm start (10 steps of 4 demonstrations) -> eval (8)"
  )
  c.sft.steps = 0
  assert run_overview(c, resume_step=None, num_eval_tasks=8) == (
    "[jaxcredit] runs/x, fresh run: RL steps 1-6 (6 x 8 rollouts, trace) -> eval (8)"
  )


def test_periodic_evals_are_listed():
  c = config()
  c.eval.sft_every, c.eval.every = 5, 2
  assert run_overview(c, resume_step=None, num_eval_tasks=8) == (
    "[jaxcredit] runs/x, fresh run: eval (8 held-out tasks) -> warm start (10 steps of 4 demonstrations, an eval "
    "every 5) -> eval (8) -> RL steps 1-6 (6 x 8 rollouts, trace, an eval every 2) -> eval (8)"
  )


def test_rollouts_sampled_ahead_are_listed():
  c = config()
  c.sft.steps, c.rollout.async_depth = 0, 2
  assert run_overview(c, resume_step=None, num_eval_tasks=8) == (
    "[jaxcredit] runs/x, fresh run: RL steps 1-6 (6 x 8 rollouts, trace, rollouts sampled up to 2 step(s) ahead) "
    "-> eval (8)"
  )
