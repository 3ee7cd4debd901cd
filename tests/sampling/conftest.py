"""Session fixtures for the sampling tests: two random decoders, one Sampler, fixed prompts.

Every test uses batch 3 and prompts that pad to the same bucket, so the directory compiles the prefill and the
decode chunk once each.
"""

import numpy as np
import pytest

from jaxcredit.sampling import Sampler
from tests.sampling.sampling_reference import CFG, MAX_LEN, PAD_ID, PROMPT_LENGTHS, make_model


@pytest.fixture(scope="session")
def model():
  return make_model(0)


@pytest.fixture(scope="session")
def other_model():
  return make_model(1)


@pytest.fixture(scope="session")
def sampler(model):
  return Sampler(model, max_len=MAX_LEN, pad_id=PAD_ID, chunk_size=8, prompt_bucket=8)


@pytest.fixture(scope="session")
def prompts():
  rng = np.random.default_rng(1234)
  return [[int(t) for t in rng.integers(1, CFG.vocab_size, n)] for n in PROMPT_LENGTHS]
