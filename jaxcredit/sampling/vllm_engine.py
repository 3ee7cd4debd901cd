"""Rollouts from a vLLM server (OpenAI-compatible, token-in token-out) behind the `Sampler` interface.

`VLLMEngine` has what the rollout loop and the trainer call on a `Sampler`: `generate(prompts, params, key,
decode_text=)`, `update_model(model, version=)`, `release_weights()`, `stats`, `close()`. Prompts go to
`/v1/completions` as token ids, one request per row (each with its own seed, drawn from the JAX key, so the rows of
a group differ); the sampled ids and their log-probs come back (`return_tokens_as_token_ids`, `logprobs: 0`).
The server's prefix cache serves the growing history of a multi-turn rollout.

Log-probs. The server must run with `--logprobs-mode processed_logprobs`: its log-probs are then those of
softmax(logits / temperature), as the trainer's and `Sampler`'s are. With top-p below 1 vLLM renormalises them over
the kept tokens, so `generate` refuses top_p < 1 unless the call is greedy (greedy rollouts' log-probs are never
trained on).

Weight sync (`update_model`). The policy's parameters are written as safetensors shards into
`<weights_dir>/v<version>` (the `jaxcredit export` tensor layout), the server reloads them in place
(`POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": ...}}`), and its prefix cache is reset
(`POST /reset_prefix_cache`), so no prefix computed with the old weights serves the new policy. Both endpoints are
vLLM's development API: the server needs `VLLM_SERVER_DEV_MODE=1` (a launched server gets it) and must read the
weights folder (same machine or shared filesystem).

`launch_server` starts `python -m vllm.entrypoints.openai.api_server` from a configured Python as a process group
and `VLLMEngine.close` stops it (SIGTERM, then SIGKILL after 20 s); an `atexit` hook stops it too.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxcredit import server_process
from jaxcredit.sampling.sampler import (
  FINISH_LENGTH,
  FINISH_STOP_STRING,
  FINISH_STOP_TOKEN,
  SampleOutput,
  SamplingParams,
)
from jaxcredit.server_process import ServerProcess, free_port

_TOKEN_PREFIX = "token_id:"


class EngineError(RuntimeError):
  """The serving engine is unreachable, serves another model, or answered a request with an error."""


def _http(url: str, body: Any = None, *, timeout: float = 600.0) -> Any:
  """GET (body None) or POST JSON to `url`; the decoded JSON answer (None for an empty one)."""
  data = None if body is None else json.dumps(body).encode()
  request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      raw = response.read()
  except urllib.error.HTTPError as e:
    detail = e.read().decode(errors="replace")[:500]
    raise EngineError(f"{url} answered HTTP {e.code}: {detail}") from None
  return json.loads(raw) if raw.strip() else None


def served_models(url: str, *, timeout: float = 5.0) -> list[str]:
  """The model names an OpenAI-compatible server at `url` serves (`GET /v1/models`).

  Raises:
    EngineError: nothing answers at `url`, or the answer is not a model list (one line naming the URL).
  """
  try:
    answer = _http(f"{url.rstrip('/')}/v1/models", timeout=timeout)
  except (urllib.error.URLError, OSError, EngineError) as e:
    reason = getattr(e, "reason", e)
    raise EngineError(f"no OpenAI-compatible server answers at {url} ({reason})") from None
  try:
    return [m["id"] for m in answer["data"]]
  except (TypeError, KeyError):
    raise EngineError(f"{url}/v1/models did not answer a model list: {str(answer)[:200]}") from None


def launch_server(
  python: str,
  model_dir: str | os.PathLike,
  *,
  served_model_name: str,
  dtype: str,
  max_model_len: int,
  log_path: str | os.PathLike,
  port: int = 0,
  kv_cache_gib: int = 1,
  extra_args: Sequence[str] = (),
  startup_timeout_s: float = 900.0,
  progress: Callable[[str], None] | None = None,
) -> ServerProcess:
  """Starts a vLLM OpenAI-compatible server on 127.0.0.1 and waits until it serves `served_model_name`.

  Args:
    python: a Python interpreter with vLLM installed (e.g. its own virtual environment's `bin/python`).
    model_dir: an HF folder (config.json, safetensors, tokenizer files), e.g. from `jaxcredit export`.
    served_model_name: the name requests use.
    dtype: "float32" | "bfloat16" | ... (vLLM's `--dtype`).
    max_model_len: the longest prompt + completion, in tokens.
    log_path: the server's stdout and stderr go here.
    port: 0 picks a free port.
    kv_cache_gib: `VLLM_CPU_KVCACHE_SPACE` (the CPU backend's KV cache, whole GiB).
    extra_args: more command-line arguments for the server.
    startup_timeout_s: how long to wait for it to answer.
    progress: called with a short status line while waiting.

  Returns:
    The running `ServerProcess` (its `url`), stopped by `stop()` and at interpreter exit.

  Raises:
    FileNotFoundError: `python` does not exist.
    EngineError: the server exited or did not answer in time (with the tail of its log).
  """
  if not shutil.which(python) and not Path(python).is_file():
    raise FileNotFoundError(f"config.rollout.vllm.python={python!r} does not exist")
  port = port or free_port()
  url = f"http://127.0.0.1:{port}"
  env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE=str(int(kv_cache_gib)))
  env.pop("XLA_FLAGS", None)
  env.pop("JAX_PLATFORMS", None)
  cmd = [
    python,
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    str(model_dir),
    "--served-model-name",
    served_model_name,
    "--dtype",
    dtype,
    "--host",
    "127.0.0.1",
    "--port",
    str(port),
    "--max-model-len",
    str(max_model_len),
    "--logprobs-mode",
    "processed_logprobs",
    "--enable-prefix-caching",
    *extra_args,
  ]

  def ready() -> bool:
    try:
      return served_model_name in served_models(url, timeout=2.0)
    except EngineError:
      return False

  return server_process.launch(
    cmd,
    url=url,
    ready=ready,
    log_path=log_path,
    what="the vLLM server",
    error=EngineError,
    env=env,
    startup_timeout_s=startup_timeout_s,
    poll_s=2.0,
    progress=progress,
  )


class VLLMEngine:
  """Samples through a vLLM server; the `Sampler` interface the rollout loop and the trainer use.

  Args:
    url: the server's base URL (http://host:port).
    served_model_name: the model name the server serves; checked at construction.
    model_cfg: the policy's `ModelConfig` (the weight layout of a sync).
    weights_dir: where weight syncs write `v<version>/` folders (the server must read it); the previous version's
      folder is removed after each sync.
    flatten_params: model -> {'/'-joined parameter path: host array}, the parameters a sync writes.
    server: the `ServerProcess` when this process launched the server (stopped by `close`), else None.
    request_timeout_s: per request.

  Attributes:
    version: the policy version the server holds (`update_model(version=)`), None before the first sync.
    stats: counters summed over calls: rows, decode_tokens, syncs.
    sync_seconds: the seconds of every weight sync so far, in order.

  Raises:
    EngineError: at construction, when nothing answers at `url` or it does not serve `served_model_name` (one line
      naming both).
  """

  def __init__(
    self,
    url: str,
    served_model_name: str,
    model_cfg,
    weights_dir: str | os.PathLike,
    flatten_params: Callable[[Any], Mapping[str, np.ndarray]],
    *,
    server: ServerProcess | None = None,
    request_timeout_s: float = 600.0,
  ):
    self.url = url.rstrip("/")
    self.served_model_name = served_model_name
    self.model_cfg = model_cfg
    self.weights_dir = Path(weights_dir)
    self.flatten_params = flatten_params
    self.server = server
    self.request_timeout_s = request_timeout_s
    self.version: int | None = None
    self.stats: dict[str, int] = {"rows": 0, "decode_tokens": 0, "syncs": 0}
    self.sync_seconds: list[float] = []
    self._last_weights: Path | None = None
    models = served_models(self.url)
    if served_model_name not in models:
      raise EngineError(
        f"the server at {self.url} serves {models}, not config.rollout.vllm.served_model_name={served_model_name!r}"
      )

  # The Sampler interface ------------------------------------------------------------------------------------------

  def update_model(self, model, *, version: int | None = None, max_staleness: int = 0) -> None:
    """Puts `model`'s parameters (policy version `version`) into the server, unless the server's version is at
    most `max_staleness` versions older. `version=None` always syncs (and leaves the server's version unknown).

    Raises:
      EngineError: the server refused the reload or the prefix-cache reset.
    """
    if version is not None and self.version is not None and 0 <= version - self.version <= max_staleness:
      return
    t0 = time.time()
    label = "latest" if version is None else f"v{version}"
    folder = self.weights_dir / label
    from jaxcredit.models.hf import save_hf_weights

    save_hf_weights(self.model_cfg, self.flatten_params(model), folder, untie=True)
    self.reload(folder)
    if self._last_weights is not None and self._last_weights != folder:
      shutil.rmtree(self._last_weights, ignore_errors=True)
    self._last_weights = folder
    self.version = version
    self.stats["syncs"] += 1
    self.sync_seconds.append(time.time() - t0)

  def reload(self, folder: str | os.PathLike) -> None:
    """The server reloads its weights from the safetensors in `folder`, then drops its prefix cache."""
    _http(
      f"{self.url}/collective_rpc",
      {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
      timeout=self.request_timeout_s,
    )
    self.reset_prefix_cache()

  def reset_prefix_cache(self) -> None:
    """Drops every cached prefix (KV blocks computed with earlier weights); retried while requests hold blocks."""
    for _ in range(50):
      answer = _http(f"{self.url}/reset_prefix_cache", {}, timeout=self.request_timeout_s)
      if answer is None or answer.get("success", True):
        return
      time.sleep(0.1)
    raise EngineError(f"{self.url}/reset_prefix_cache kept answering success=false")

  def release_weights(self) -> None:
    """Nothing to release on this side: the weights live in the server."""

  def close(self) -> None:
    """Stops the server when this process launched it."""
    if self.server is not None:
      self.server.stop()

  def generate(
    self,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    key,
    *,
    decode_text: Callable[[list[int]], str] | None = None,
  ) -> SampleOutput:
    """Samples a completion of each prompt (token ids) on the server. Same contract as `Sampler.generate`.

    Greedy (`params.top_p <= 1 / vocab`) is sent as temperature 0. Each row's seed comes from `key`. A token the
    server returns without a log-prob (null, or vLLM's -9999.0 for -inf) gets NaN in `logprobs` (the trainer leaves it
    out of the loss).

    Raises:
      ValueError: top_p < 1 on a sampled (not greedy) call: the server's log-probs would be renormalised over the
        kept tokens, unlike the trainer's.
      EngineError: a request failed.
    """
    del decode_text  # stop strings are matched by the server on its own detokenisation
    import jax

    greedy = params.top_p <= 1.0 / self.model_cfg.vocab_size
    if not greedy and params.top_p < 1.0:
      raise ValueError(
        f"config.sampling.top_p={params.top_p}: with rollout.engine='vllm' sampling needs top_p=1 (vLLM's "
        f"log-probs under top-p are renormalised over the kept tokens, the trainer's are not)"
      )
    n = len(prompts)
    seeds = np.asarray(jax.random.randint(key, (max(n, 1),), 0, 2**31 - 1))[:n]
    base = {
      "model": self.served_model_name,
      "max_tokens": params.max_new_tokens,
      "temperature": 0.0 if greedy else float(params.temperature),
      "top_p": 1.0,
      "logprobs": 0,
      "return_tokens_as_token_ids": True,
      "stop_token_ids": list(params.stop_token_ids),
      "stop": list(params.stop_strings),
      "include_stop_str_in_output": True,
      "skip_special_tokens": False,
    }

    def one(i: int) -> dict:
      body = dict(base, prompt=[int(t) for t in prompts[i]], seed=int(seeds[i]))
      answer = _http(f"{self.url}/v1/completions", body, timeout=self.request_timeout_s)
      return answer["choices"][0]

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(n, 64))) as pool:
      choices = list(pool.map(one, range(n)))
    tokens, logprobs, reasons = [], [], []
    for choice in choices:
      lp = choice.get("logprobs") or {}
      ids = [int(t[len(_TOKEN_PREFIX) :]) for t in lp.get("tokens", [])]
      # A token without a log-prob (null) is NaN, not -inf: -inf would read as "impossible under the engine" and
      # give the token the largest importance weight; the trainer leaves NaN tokens out of the loss.
      values = [_logprob_or_nan(v) for v in lp.get("token_logprobs", [])]
      if len(ids) != len(values):
        raise EngineError(f"{self.url}: {len(ids)} tokens but {len(values)} log-probs in a completion")
      tokens.append(ids)
      logprobs.append(np.asarray(values, np.float32))
      reasons.append(_finish_reason(choice, ids, params))
      self.stats["rows"] += 1
      self.stats["decode_tokens"] += len(ids)
    return SampleOutput(tokens=tokens, logprobs=logprobs, finish_reasons=reasons)


VLLM_LOGPROB_FLOOR = -9999.0
"""vLLM's OpenAI server writes a log-prob of -inf as -9999.0 (its JSON clamp): at or below it there is no log-prob."""


def _logprob_or_nan(value) -> float:
  """A server log-prob as a float, NaN where there is none: null, a non-number, a non-finite value, or vLLM's -inf
  sentinel (`VLLM_LOGPROB_FLOOR`); the trainer leaves such tokens out of the loss (`trajectory.drop_invalid_behavior_logp`)
  instead of reading a sentinel as a real probability (it would get the largest importance weight)."""
  if value is None or isinstance(value, bool):
    return float("nan")
  try:
    x = float(value)
  except (TypeError, ValueError):
    return float("nan")
  return x if np.isfinite(x) and x > VLLM_LOGPROB_FLOOR else float("nan")


def _finish_reason(choice: dict, ids: list[int], params: SamplingParams) -> str:
  """vLLM's finish_reason/stop_reason as `Sampler`'s: stop_token | stop_string | length."""
  if choice.get("finish_reason") == "length":
    return FINISH_LENGTH
  stop = choice.get("stop_reason")
  if isinstance(stop, str):
    return FINISH_STOP_STRING
  if ids and (ids[-1] in params.stop_token_ids or stop is None):
    return FINISH_STOP_TOKEN
  return FINISH_STOP_STRING
