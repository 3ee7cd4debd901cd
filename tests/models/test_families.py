"""The model-family table (`jaxcredit.models.families.FAMILIES`): every row complete, incomplete rows refused by
name, config.json's model_type looked up in the table, and a row added in a test converting a transformers
checkpoint through its own tensor names."""

import dataclasses
import json

import numpy as np
import pytest

from jaxcredit.models import families
from jaxcredit.models.decoder import param_shapes
from jaxcredit.models.families import FAMILIES, HF_TENSORS, FamilySpec, GGUFSpec, family_of_config
from jaxcredit.models.hf_config import SUPPORTED_MODEL_TYPES, config_from_hf, hf_config_from_model_config
from tests.fixtures.tiny_model import tiny_decoder_config

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def _cfg(spec: FamilySpec):
  """A tiny ModelConfig of the row's features (norm_topk_prob only where config.json holds it: MoE)."""
  moe = MOE if spec.moe else {}
  return tiny_decoder_config(qk_norm=spec.qk_norm, **moe, norm_topk_prob=spec.moe, tie_word_embeddings=False)


def test_supported_model_types_are_the_table():
  assert SUPPORTED_MODEL_TYPES == tuple(FAMILIES) == ("llama", "qwen3", "qwen3_moe")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_row_is_complete(model_type):
  """A row names every parameter of its decoder (as `param_shapes` lists them) for HF, GGUF (when it has one) and
  the logical axes, each axes tuple of the parameter's rank, and its tensor names are distinct; its ModelConfig
  finds it again and exports its architecture."""
  spec = FAMILIES[model_type]
  assert dataclasses.replace(spec) == spec  # __post_init__'s checks pass
  cfg = _cfg(spec)
  shapes = param_shapes(cfg)
  assert set(spec.params()) == set(shapes)
  for param, shape in shapes.items():
    assert len(spec.logical_axes[param]) == len(shape), param
  tables = [spec.hf_tensors] + ([spec.gguf.tensors] if spec.gguf else [])
  for table in tables:
    names = [table[p] for p in spec.params()]
    assert len(set(names)) == len(names), names
  assert spec.hf_architecture.endswith("ForCausalLM")
  assert family_of_config(cfg) == model_type
  hf = hf_config_from_model_config(cfg)
  assert (hf["model_type"], hf["architectures"]) == (model_type, [spec.hf_architecture])
  assert config_from_hf(hf) == cfg


@pytest.mark.parametrize(
  "fields, message",
  [
    (
      dict(hf_tensors={k: v for k, v in HF_TENSORS.items() if k != "layers/q_norm"}),
      r"FamilySpec\(Qwen3ForCausalLM\).hf_tensors lacks parameters \['layers/q_norm'\]",
    ),
    (
      dict(gguf=GGUFSpec("qwen3", {"embedding": "token_embd.weight"}, permuted_qk=False, rope_freqs=False)),
      r"gguf.tensors lacks parameters \['layers/attn_norm', ",
    ),
    (dict(logical_axes={}), r"logical_axes lacks parameters \['embedding', "),
    (dict(hf_fused_experts=families.HF_FUSED_EXPERTS), "hf_fused_experts is for MoE families"),
  ],
)
def test_an_incomplete_row_is_refused_naming_what_it_lacks(fields, message):
  with pytest.raises(ValueError, match=message):
    dataclasses.replace(FAMILIES["qwen3"], **fields)


def test_an_moe_row_with_a_gguf_spec_is_refused():
  with pytest.raises(ValueError, match="the GGUF loader reads dense models only"):
    dataclasses.replace(FAMILIES["qwen3_moe"], gguf=FAMILIES["qwen3"].gguf)


def test_an_unknown_model_type_is_refused_listing_the_table(monkeypatch):
  with pytest.raises(ValueError, match=r"model_type 'gpt2' is not supported; supported: llama, qwen3, qwen3_moe$"):
    config_from_hf({"model_type": "gpt2"})
  with pytest.raises(ValueError, match=r"'qwen2' is not supported \(qwen2 has q/k/v biases.*\); supported: llama"):
    config_from_hf({"model_type": "qwen2"})
  with pytest.raises(ValueError, match=r"model_type \['llama'\] is not supported"):
    config_from_hf({"model_type": ["llama"]})
  monkeypatch.setitem(FAMILIES, "my_llama", FAMILIES["llama"])
  with pytest.raises(ValueError, match=r"supported: llama, qwen3, qwen3_moe, my_llama$"):
    config_from_hf({"model_type": "gpt2"})


def test_a_config_no_row_has_is_refused_naming_its_features():
  cfg = tiny_decoder_config(qk_norm=False, **MOE)
  with pytest.raises(ValueError, match=r"no model family has ModelConfig's features qk_norm=False, moe=True"):
    family_of_config(cfg)
  with pytest.raises(ValueError, match=r"model family 'llama' has qk_norm=False, moe=False; the ModelConfig has"):
    family_of_config(tiny_decoder_config(qk_norm=True), "llama")


def _rename(source, folder, model_type, rename):
  """The HF folder `source` with its tensors renamed (one file) and its config.json's model_type replaced."""
  from jaxcredit.models.hf import iter_hf_tensors, write_safetensors

  folder.mkdir()
  tensors = {rename(name): array for name, array in iter_hf_tensors(source)}
  write_safetensors(
    folder / "model.safetensors", [(n, a.dtype, a.shape) for n, a in tensors.items()], lambda n: tensors[n]
  )
  config = json.loads((source / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps(dict(config, model_type=model_type)))
  return folder


def test_a_new_row_converts_a_transformers_checkpoint_through_its_own_names(tmp_path, monkeypatch):
  """A family added as one row (Llama's computation, other tensor names) converts a transformers Llama checkpoint
  whose tensors carry those names into the very parameters the llama row gives, and exports the names back."""
  from flax import nnx
  from hf_checkpoints import save_hf, torch_model

  from jaxcredit.models import export_hf, load
  from jaxcredit.models.hf import convert_hf, iter_hf_tensors

  names = {param: name.replace("model.", "backbone.") for param, name in HF_TENSORS.items()}
  monkeypatch.setitem(FAMILIES, "backbone_llama", dataclasses.replace(FAMILIES["llama"], hf_tensors=names))
  source = save_hf(torch_model("llama", tie_word_embeddings=False), tmp_path / "hf")
  renamed = _rename(source, tmp_path / "renamed", "backbone_llama", lambda n: n.replace("model.", "backbone."))

  ours, cfg = load(renamed, cache_dir=tmp_path / "cache")
  reference, ref_cfg = load(source, cache_dir=tmp_path / "cache")
  assert cfg == ref_cfg and not cfg.qk_norm
  flat = nnx.to_flat_state(nnx.state(ours, nnx.Param))
  ref_flat = dict(nnx.to_flat_state(nnx.state(reference, nnx.Param)))
  assert {path for path, _ in flat} == set(ref_flat)
  for path, value in flat:
    np.testing.assert_array_equal(
      np.asarray(value.get_value()), np.asarray(ref_flat[path].get_value()), err_msg=str(path)
    )

  convert_hf(renamed, tmp_path / "conv")
  export_hf(tmp_path / "conv", tmp_path / "exp")
  exported, expected = dict(iter_hf_tensors(tmp_path / "exp")), dict(iter_hf_tensors(renamed))
  assert sorted(exported) == sorted(expected) and all(n.startswith(("backbone.", "lm_head")) for n in exported)
  for name, array in expected.items():
    assert exported[name].tobytes() == array.tobytes(), name
  assert json.loads((tmp_path / "exp" / "config.json").read_text())["model_type"] == "backbone_llama"
