"""jaxcredit/models as modules of one job each (issue 33): none over 900 lines, the split-out modules importing
downward only, and every name of the old single-file hf.py and decoder.py still reachable from its old module as the
very object the code uses."""

import ast
import importlib
import pathlib

import pytest

import jaxcredit.models

MODELS_DIR = pathlib.Path(jaxcredit.models.__file__).parent
MAX_LINES = 900

# The jaxcredit.models modules that each module split out of hf.py and decoder.py may import (at module level or
# inside a function). The direction is config <- rope, attention, kv_cache, moe, logical_axes <- decoder and
# config, logical_axes <- families <- tensor_map, hf_config and config <- safetensors_io <- tensor_map, param_store
# <- hf.
ALLOWED_IMPORTS = {
  "logical_axes": set(),
  "rope": {"config"},
  "attention": {"config"},
  "kv_cache": {"config"},
  "moe": {"config"},
  "decoder": {"config", "chunked_attention", "splash", "logical_axes", "rope", "attention", "kv_cache", "moe"},
  "safetensors_io": set(),
  "families": {"config", "logical_axes"},
  "hf_config": {"config", "rope", "families"},
  "tensor_map": {"config", "safetensors_io", "families"},
  "param_store": set(),
  "hf": {
    "config",
    "decoder",
    "gguf_loader",
    "tokenizer",
    "safetensors_io",
    "hf_config",
    "tensor_map",
    "param_store",
    "families",
  },
}

# Every module-level name the single-file hf.py and decoder.py defined (before issue 33's split).
OLD_NAMES = {
  "hf": (
    "SUPPORTED_MODEL_TYPES _ST_DTYPES _ST_CODES _PARAM_DTYPES DTYPE_ALIASES TOKENIZER_FILES _HF_DIR _SKIPPED "
    "_WRITE_BUDGET_BYTES _CHUNK_BYTES _DATA_FILE_BYTES canonical_dtype TensorInfo read_safetensors_header read_tensor "
    "write_safetensors read_inventory _HF_SIZES _HF_MOE_SIZES config_from_hf hf_config_from_model_config "
    "llama3_from_freq_factors Slot hf_slots _fused_expert_slots _first plan_conversion _unit_ndim _orbax_name "
    "ParamsWriter open_params _status_kib PeakMemory _AtomicFolder _progress inspect_hf convert_hf _write_sidecars "
    "convert_gguf _shard_plan export_hf save_hf_weights iter_hf_tensors"
  ).split(),
  "decoder": (
    "_MASKED_SCORE _LAYER_PARAMS _PARAM_LOGICAL_AXES ACTIVATION_AXES param_logical_axes default_logical_axes KVCache "
    "init_cache rms_norm rope_inv_freq rope_cos_sin apply_rope attention two_part_attention _single_query_attention "
    "_random_params compute_params DecoderLayers _project_heads _flatten_dots _dense _qkv _out_projection_and_mlp route moe_mlp "
    "_ragged_experts _moe_sharded _check_rank Decoder packed_attention_mask attention_impl param_shapes set_params"
  ).split(),
}


def _models_imports(path: pathlib.Path) -> set[str]:
  """The `jaxcredit.models.<module>` names that a file imports."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxcredit.models."):
      out.add(node.module.removeprefix("jaxcredit.models.").split(".")[0])
    elif isinstance(node, ast.Import):
      out |= {a.name.removeprefix("jaxcredit.models.") for a in node.names if a.name.startswith("jaxcredit.models.")}
  return out


def test_no_models_module_is_over_900_lines():
  sizes = {str(p.relative_to(MODELS_DIR)): len(p.read_text().splitlines()) for p in sorted(MODELS_DIR.rglob("*.py"))}
  assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
  assert "hf.py" in sizes and "decoder.py" in sizes, sorted(sizes)


@pytest.mark.parametrize("name", sorted(ALLOWED_IMPORTS))
def test_split_modules_import_downward_only(name):
  path = MODELS_DIR / f"{name}.py"
  assert path.is_file(), f"models/{name}.py is gone: update ALLOWED_IMPORTS"
  imported = _models_imports(path)
  assert imported <= ALLOWED_IMPORTS[name], f"models/{name}.py imports {sorted(imported - ALLOWED_IMPORTS[name])}"
  assert ast.get_docstring(ast.parse(path.read_text())), f"models/{name}.py has no module docstring"


@pytest.mark.parametrize("old,name", [(old, name) for old, names in OLD_NAMES.items() for name in names])
def test_old_names_are_the_objects_their_module_uses(old, name):
  """`jaxcredit.models.<old>.X` is the very object of the module that defines X (reading it or passing it on is as
  before), and X is defined in exactly one module."""
  module = importlib.import_module(f"jaxcredit.models.{old}")
  assert hasattr(module, name), f"jaxcredit.models.{old}.{name} is gone"
  owners = []
  for m in ALLOWED_IMPORTS:
    tree = ast.parse((MODELS_DIR / f"{m}.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if name in defined:
      owners.append(m)
  assert len(owners) == 1, f"{name} is defined in {owners}"
  assert getattr(importlib.import_module(f"jaxcredit.models.{owners[0]}"), name) is getattr(module, name)
