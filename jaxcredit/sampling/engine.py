"""The rollout-engine interface: `RolloutEngine`, what the rollout loop and the trainer call on whoever samples.

jaxcredit's `Sampler` (in this process) and `VLLMEngine` (a vLLM server) satisfy it; a row of
`jaxcredit.train.tables.engines.ENGINES` builds one, and the trainer refuses an object that lacks one of its members
(`missing_engine_members`). An engine that can keep a rollout's KV cache between turns also has `session()`
(`SessionEngine`); the rollout loop uses it where it exists.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import jax

from jaxcredit.sampling.sampler import SampleOutput, SamplingParams


@runtime_checkable
class RolloutEngine(Protocol):
  """What samples a run's rollouts (`config.rollout.engine`).

  Attributes:
    stats: counters summed over calls (str -> int; the trainer logs each step's increase as `sampler_<name>`).
    version: the trainer's policy version of the weights it samples with (`update_model(version=)`), None before
      the first update or when unknown.
  """

  version: int | None

  @property
  def stats(self) -> Mapping[str, int]:
    """Counters summed over calls (read-only here; an engine may keep them in any mapping)."""
    ...

  def generate(
    self,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    key: jax.Array,
    *,
    decode_text: Callable[[list[int]], str] | None = None,
  ) -> SampleOutput:
    """Samples a continuation of each prompt.

    Args:
      prompts: B >= 1 non-empty lists of token ids in [0, vocab_size).
      params: temperature, top_p, max_new_tokens and stop conditions.
      key: a jax.random key; the same key, prompts and weights give the same output.
      decode_text: a row's new token ids -> text, for stop strings (an engine that detokenises itself ignores it).

    Returns:
      SampleOutput: per row, the sampled tokens, their float32 log-probs under the engine (NaN where it gave
      none) and the finish reason.

    Raises:
      ValueError: for a request the engine cannot serve (named, with the fix).
    """
    ...

  def update_model(self, model: Any, *, version: int | None = None, max_staleness: int = 0) -> None:
    """Samples with `model`'s current parameters (an nnx module with `.cfg`) from the next `generate` on, unless
    the weights it holds are at most `max_staleness` versions older than `version` (it may then keep them)."""
    ...

  def release_weights(self) -> None:
    """Frees what the engine holds of the weights until the next `update_model` (the update needs the memory)."""
    ...

  def close(self) -> None:
    """Stops what the engine started (a server process); it is not used afterwards."""
    ...


@runtime_checkable
class SessionEngine(RolloutEngine, Protocol):
  """A `RolloutEngine` that keeps rows' KV caches between `generate` calls (`Sampler.session`)."""

  def session(self) -> Any:
    """An object with `generate(prompts, params, key, *, decode_text=None, ids=None)` and `close()`, whose rows
    (named by `ids`) keep their cached prefix from one call to the next."""
    ...


# The members a rollout engine must have: RolloutEngine's methods, then its attributes (properties and annotated).
_ENGINE_METHODS = tuple(
  n for n, v in vars(RolloutEngine).items() if not n.startswith("_") and callable(v) and not isinstance(v, property)
)
ENGINE_MEMBERS = _ENGINE_METHODS + tuple(n for n, v in vars(RolloutEngine).items() if isinstance(v, property))
ENGINE_MEMBERS += tuple(RolloutEngine.__annotations__)


def missing_engine_members(engine: Any) -> list[str]:
  """The members of `RolloutEngine` that `engine` lacks (a method that is not callable counts as missing), in
  `ENGINE_MEMBERS` order; [] when it is one."""
  methods = set(_ENGINE_METHODS)
  return [
    name
    for name in ENGINE_MEMBERS
    if not hasattr(engine, name) or (name in methods and not callable(getattr(engine, name)))
  ]
