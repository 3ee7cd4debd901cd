"""A small OpenEnv environment for jaxcredit's example config and tests: reply with a word.

`reset(seed=k)` picks word k of `WORDS` (the same word for the same seed: a task's rollouts start from one state);
the observation's `prompt` asks for it and `answer` holds it (the gold answer a teacher may read; the policy sees
only the prompt). Each `step(message)` pays 1.0 when the message, stripped and lower-cased, is the word, and ends
the episode; a wrong reply gets `feedback` and one more try (two in all), then ends with 0.0.

Serve it with openenv-core (`pip install openenv-core`):

  python -m uvicorn server:app --app-dir examples/openenv_echo --host 127.0.0.1 --port 8000

`configs/openenv_echo.py` starts it itself and trains on it.
"""

from __future__ import annotations

from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ("apple", "river", "stone", "cloud", "green", "light", "music", "table", "paper", "house", "tiger", "bread")
TRIES = 2


class EchoAction(Action):
  message: str = Field(..., description="the assistant's reply")


class EchoObservation(Observation):
  prompt: str = Field(default="", description="the request (on reset)")
  answer: str = Field(default="", description="the word asked for (the gold answer)")
  feedback: str = Field(default="", description="what the environment says after a wrong reply")


class EchoEnvironment(Environment):
  SUPPORTS_CONCURRENT_SESSIONS = True

  def __init__(self):
    super().__init__()
    self._state = State(episode_id=str(uuid4()), step_count=0)
    self._word = WORDS[0]

  def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> EchoObservation:
    self._word = WORDS[(seed or 0) % len(WORDS)]
    self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
    return EchoObservation(prompt=f"Reply with exactly one word: {self._word}", answer=self._word, reward=None)

  def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs) -> EchoObservation:
    self._state.step_count += 1
    right = action.message.strip().strip(".").lower() == self._word
    if right or self._state.step_count >= TRIES:
      return EchoObservation(done=True, reward=1.0 if right else 0.0)
    return EchoObservation(feedback=f"Not quite. Reply with exactly one word: {self._word}", reward=0.0)

  @property
  def state(self) -> State:
    return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=64)
