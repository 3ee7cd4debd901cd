"""Batched generation with a KV cache, and the log-probs the sampler records and the trainer recomputes."""

from jaxcredit.models.logprobs import (
  chunked_logprobs_and_entropies,
  logprobs_from_logits,
  sequence_logprobs,
  sequence_logprobs_and_entropies,
  temperature_log_softmax,
)
from jaxcredit.sampling.sampler import SampleOutput, Sampler, SamplingParams

__all__ = [
  "SampleOutput",
  "Sampler",
  "SamplingParams",
  "chunked_logprobs_and_entropies",
  "logprobs_from_logits",
  "sequence_logprobs",
  "sequence_logprobs_and_entropies",
  "temperature_log_softmax",
]
