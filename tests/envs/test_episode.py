"""The declared episode `info` keys (`jaxcredit.envs.episode`): every environment keeps them, and a step whose info
lacks one is refused by the rollout loop with the environment's class and the key named (instead of read as 0)."""

import types

import jax
import numpy as np
import pytest

from jaxcredit.envs import arithmetic, episode, spec
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import run_rollouts
from jaxcredit.sampling import SamplingParams
from jaxcredit.sampling.sampler import SampleOutput
from tests.fixtures.tiny_chat import tiny_tokenizer

TASK = arithmetic.ArithmeticTask(
  task_id="t", question="What is 2+3?", answer="5", source="basic_arithmetic", expression="2+3"
)


class DropsKey:
  """An environment whose info lacks one declared key."""

  def __init__(self, key):
    self.key = key

  def step(self, text):
    info = episode.new_info()
    del info[self.key]
    return spec.StepResult(None, True, info)

  def reward(self):
    return 0.0


class OneTurn:
  def generate(self, prompts, params, key, decode_text=None):
    return SampleOutput(
      tokens=[[65]] * len(prompts),
      logprobs=[np.zeros(1, np.float32)] * len(prompts),
      finish_reasons=["stop_token"] * len(prompts),
    )


def test_new_info_holds_the_declared_keys_then_the_environments_own():
  info = episode.new_info(answer=None, searches=0)
  assert list(info) == [*episode.EpisodeInfo.__annotations__, "answer", "searches"]
  assert set(episode.TRAINER_KEYS) <= set(episode.EpisodeInfo.__annotations__)
  assert info["tool_calls"] == info["tool_errors"] == info["turns"] == 0 and info["finish"] is None
  assert episode.new_info(tool_calls=3)["tool_calls"] == 3


@pytest.mark.parametrize("key", episode.TRAINER_KEYS)
def test_a_step_without_a_declared_key_is_refused_naming_env_and_key(key):
  with pytest.raises(ValueError, match=rf"DropsKey\.step\(\) returned info without the key '{key}'"):
    episode.trainer_info(DropsKey(key).step(""), DropsKey(key))
  tok = tiny_tokenizer()
  params = SamplingParams(max_new_tokens=4, stop_token_ids=(tok.eos_id,))
  with pytest.raises(ValueError, match=rf"DropsKey.*'{key}'"):
    run_rollouts(
      OneTurn(),
      tok,
      ChatFormat.from_tokenizer(tok),
      [DropsKey(key)],
      [[{"role": "user", "content": "q"}]],
      params,
      jax.random.key(0),
      max_turns=1,
      max_len=64,
    )


def test_a_step_without_info_is_refused():
  with pytest.raises(TypeError, match="DropsKey.step\\(\\) returned no info dict"):
    episode.trainer_info(types.SimpleNamespace(info=None), DropsKey("answered"))


def test_environments_start_from_new_info_and_refuse_a_step_after_the_end():
  env = arithmetic.ArithmeticEnv(TASK, max_tool_calls=1)
  assert env.info == episode.new_info(answer=None)
  result = env.step("<answer>5</answer>")
  assert result.done and episode.trainer_info(result, env)["answered"] is True and result.info["turns"] == 1
  with pytest.raises(RuntimeError, match="^step\\(\\) called on a finished episode$"):
    env.step("<answer>5</answer>")
