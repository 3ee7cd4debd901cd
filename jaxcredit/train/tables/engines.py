"""Rollout engines: who samples a run's rollouts (`config.rollout.engine`).

A row of `ENGINES` builds the object the trainer samples with (a `jaxcredit.sampling.engine.RolloutEngine`:
`generate`, `update_model(model, version=, max_staleness=)`, `release_weights`, `close`, `stats`, `version`; and
`session()` where it keeps a rollout's KV cache between turns) and says whether its log-probs come from another
implementation than the trainer's. For such an engine the trainer recomputes its own log-probs of the sampled tokens
before the update, reports the gap, and weights each token by the truncated importance ratio (docs/engines.md).
Adding an engine is a function and a row; `build_engine` builds a row's engine and refuses one that lacks a member.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from flax import nnx

from jaxcredit import multihost, trees
from jaxcredit.sampling import Sampler
from jaxcredit.sampling.engine import ENGINE_MEMBERS, RolloutEngine, missing_engine_members
from jaxcredit.sampling.vllm_engine import EngineError  # noqa: F401  (the CLI says an engine's failure in one line)


@dataclasses.dataclass(frozen=True)
class Engine:
  """One rollout engine.

  Attributes:
    build: (config, model, tok) -> a `RolloutEngine`; `model` is the policy (nnx module) as loaded.
    external: its log-probs are another implementation's: the trainer recomputes its own and corrects.
  """

  build: Callable[[ml_collections.ConfigDict, Any, Any], RolloutEngine]
  external: bool


def make_jax_sampler(config: ml_collections.ConfigDict, model, tok) -> Sampler:
  """jaxcredit's `Sampler`; its batch buckets are this process's share of a step's rollouts and the eval batch."""
  rollouts_per_process = config.rollout.prompts_per_step * config.rollout.group_size // jax.process_count()
  return Sampler(
    model,
    max_len=config.sampling.max_len,
    pad_id=tok.pad_id,
    chunk_size=config.sampling.chunk_size,
    prompt_bucket=config.sampling.prompt_bucket,
    batch_buckets=tuple(sorted({rollouts_per_process, config.eval.batch_size})),
  )


def flat_params(model) -> dict[str, np.ndarray]:
  """A model's parameters as host arrays keyed by '/'-joined path ('embedding', 'layers/wq', ...)."""
  flat = trees.flatten(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  return {name: np.asarray(multihost.to_host(leaf)) for name, leaf in flat.items()}


def vllm_urls(config: ml_collections.ConfigDict) -> list[str]:
  """The servers of `config.rollout.vllm.url` (comma-separated), one per training process; [] to launch them.

  Raises:
    ValueError: a URL count other than the process count (naming both).
  """
  urls = [u.strip() for u in str(config.rollout.vllm.url).split(",") if u.strip()]
  if urls and len(urls) != jax.process_count():
    raise ValueError(
      f"config.rollout.vllm.url lists {len(urls)} server(s) for {jax.process_count()} training process(es): each "
      "process samples its share of the prompt groups on its own server (comma-separated, in process order)"
    )
  return urls


def make_vllm_engine(config: ml_collections.ConfigDict, model, tok):
  """A `VLLMEngine` on this process's server in `config.rollout.vllm.url`, or on one it launches from
  `config.rollout.vllm.python` on the policy written as an HF folder into `config.rollout.vllm.dir` (with several
  processes, `dir/process_<index>`: each process its own server, folder and weight syncs).

  Raises:
    ValueError: `vllm_urls`.
    EngineError: the server is unreachable, serves another model, or did not start (its log's tail).
  """
  from jaxcredit.models.hf import save_hf_weights
  from jaxcredit.models.hf_config import hf_config_from_model_config
  from jaxcredit.sampling.vllm_engine import VLLMEngine, launch_server

  urls = vllm_urls(config)
  v = config.rollout.vllm
  folder = Path(os.path.expanduser(v.dir or os.path.join(config.workdir, "vllm")))
  if jax.process_count() > 1:
    folder = folder / f"process_{jax.process_index()}"
  server = None
  if not urls:
    model_dir = folder / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    # Untied: vLLM's CPU backend keeps a packed copy of a tied output head that an in-place reload leaves stale
    # (hf.save_hf_weights, `untie`); an untied head is reloaded like every other weight.
    hf_config = dict(hf_config_from_model_config(model.cfg), tie_word_embeddings=False)
    (model_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    tok.save_pretrained(model_dir)
    save_hf_weights(model.cfg, flat_params(model), model_dir, untie=True)
    print(f"[jaxcredit] launching a vLLM server ({v.python}) on {model_dir}; its log: {folder / 'server.log'}")
    server = launch_server(
      v.python,
      model_dir,
      served_model_name=v.served_model_name,
      dtype=model.cfg.dtype,
      max_model_len=config.sampling.max_len,
      log_path=folder / "server.log",
      port=int(v.port),
      kv_cache_gib=int(v.kv_cache_gib),
      extra_args=shlex.split(v.extra_args),
      startup_timeout_s=float(v.startup_timeout_s),
    )
    print(f"[jaxcredit] vLLM server ready at {server.url} (pid {server.pid})")
  try:
    return VLLMEngine(
      server.url if server is not None else urls[jax.process_index()],
      v.served_model_name,
      model.cfg,
      folder / "weights",
      flat_params,
      server=server,
    )
  except BaseException:
    if server is not None:
      server.stop()
    raise


ENGINES: dict[str, Engine] = {
  "jax": Engine(make_jax_sampler, external=False),
  "vllm": Engine(make_vllm_engine, external=True),
}


def build_engine(config: ml_collections.ConfigDict, model, tok) -> RolloutEngine:
  """The rollout engine of `config.rollout.engine`: its `ENGINES` row's `build(config, model, tok)`, checked.

  Raises:
    ValueError: the built object lacks a member of `RolloutEngine` (naming the row, the object's type and the
      missing members); an engine it built is closed first. What the row's `build` raises passes through.
  """
  name = config.rollout.engine
  engine = ENGINES[name].build(config, model, tok)
  missing = missing_engine_members(engine)
  if missing:
    close = getattr(engine, "close", None)
    if callable(close):
      close()
    raise ValueError(
      f"rollout engine {name!r}: ENGINES[{name!r}].build returned a {type(engine).__name__} without "
      f"{', '.join(missing)} (jaxcredit.sampling.engine.RolloutEngine: {', '.join(ENGINE_MEMBERS)})"
    )
  return engine
