"""TRACE on an OpenEnv environment the run serves itself: examples/openenv_echo (reply with a word; openenv-core).

The run starts `python -m uvicorn server:app --app-dir examples/openenv_echo` on a free port, reads each task's
prompt and gold answer from a reset (`reset(seed=k)`), sends every assistant message as the action
`{"message": text}`, shows the observation's `feedback` as the next tool message, trains on the server's reward,
and stops the server at the end (docs/environments.md, "`openenv` (an OpenEnv server)"; run it from the repository root). Needs openenv-core to serve it:

  pip install openenv-core
  jaxcredit train --config configs/openenv_echo.py
  jaxcredit train --config configs/openenv_echo.py --config.env.openenv.url=http://127.0.0.1:8000 \\
    --config.env.openenv.command=   # a server you started yourself instead
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/openenv_echo"
  c.credit.method = "trace"
  c.env.name = "openenv"
  o = c.env.openenv
  o.command = "{python} -m uvicorn server:app --app-dir examples/openenv_echo --host 127.0.0.1 --port {port}"
  o.prompt_field = "prompt"
  o.gold_field = "answer"  # TRACE scores the gold answer; without one only outcome methods run
  o.action_field = "message"
  o.observation_field = "feedback"
  o.max_turns = 2
  c.env.num_train_tasks = 64
  c.eval.num_tasks = 32
  c.sft.steps = 0  # an OpenEnv server has no demonstrations
  c.sampling.max_new_tokens = 16
  c.sampling.max_len = 160
  c.total_steps = 4
  return c
