"""A checkpoint the decoder cannot represent, or whose tensors do not match its config.json, is refused with one
line naming what is wrong, before anything is written; `jaxcredit convert` then exits 2 and leaves nothing."""

import json

import numpy as np
import pytest

from hf_checkpoints import qwen3_config, qwen3_moe_config, write_numpy_hf
from jaxcredit import cli
from jaxcredit.models import hf as hf_lib
from jaxcredit.models.hf import config_from_hf, convert_hf


def _refused(folder, tmp_path, match):
  with pytest.raises(ValueError, match=match) as info:
    convert_hf(folder, tmp_path / "out")
  assert "\n" not in str(info.value)
  assert not (tmp_path / "out").exists()
  return str(info.value)


def test_missing_tensor_is_named(tmp_path):
  name = "model.layers.1.self_attn.k_norm.weight"
  message = _refused(write_numpy_hf(tmp_path / "hf", qwen3_config(), drop=[name]), tmp_path, "missing")
  assert repr(name) in message and "(16,)" in message


def test_wrong_shape_names_tensor_and_both_shapes(tmp_path):
  name = "model.layers.0.mlp.up_proj.weight"
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config(), reshape={name: (80, 64)})
  message = _refused(folder, tmp_path, "shape")
  assert repr(name) in message and "(80, 64)" in message and "(96, 64)" in message


def test_config_not_matching_tensors_is_refused(tmp_path):
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config())
  (folder / "config.json").write_text(json.dumps(qwen3_config(intermediate_size=128)))
  message = _refused(folder, tmp_path, "shape")
  assert "mlp.gate_proj.weight" in message and "(128, 64)" in message


def test_unexpected_tensors_are_named(tmp_path):
  extra = {
    "model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32),
    "model.layers.2.mlp.up_proj.weight": np.zeros((96, 64), np.float32),
  }
  message = _refused(write_numpy_hf(tmp_path / "hf", qwen3_config(), extra=extra), tmp_path, "unexpected")
  assert all(repr(n) in message for n in extra)


def test_rotary_buffers_and_a_stored_copy_of_the_tied_head_are_skipped(tmp_path):
  config = qwen3_config(tie_word_embeddings=True)
  inventory, _ = hf_lib.read_inventory(write_numpy_hf(tmp_path / "plain", config))
  embedding = hf_lib.read_tensor(inventory["model.embed_tokens.weight"])
  extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32), "lm_head.weight": embedding}
  folder = write_numpy_hf(tmp_path / "hf", config, extra=extra)
  assert convert_hf(folder, tmp_path / "out")["tensors"] == 1 + 2 * 11 + 1


def test_tied_config_with_a_different_head_is_refused(tmp_path):
  """transformers keeps such a head untied; tying it would silently change the logits."""
  extra = {"lm_head.weight": np.ones((96, 64), np.float32)}
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config(tie_word_embeddings=True), extra=extra)
  message = _refused(folder, tmp_path, "tie_word_embeddings")
  assert "'lm_head.weight'" in message


def test_config_json_that_is_not_an_object_is_refused(tmp_path):
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config())
  (folder / "config.json").write_text("[1, 2]")
  _refused(folder, tmp_path, "JSON object")


@pytest.mark.parametrize("model_type", ["qwen2", "mistral", None])
def test_unknown_model_type_names_it_and_the_supported_ones(tmp_path, model_type):
  config = qwen3_config()
  config["model_type"] = model_type
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config())
  (folder / "config.json").write_text(json.dumps(config))
  message = _refused(folder, tmp_path, "model_type")
  assert repr(model_type) in message and "llama, qwen3, qwen3_moe" in message


@pytest.mark.parametrize(
  "field,value",
  [
    ("use_sliding_window", True),
    ("attention_bias", True),
    ("hidden_act", "gelu"),
    ("mlp_bias", True),
    ("layer_types", ["sliding_attention", "full_attention"]),
    ("partial_rotary_factor", 0.5),
  ],
)
def test_unsupported_features_are_refused_by_name(field, value):
  with pytest.raises(ValueError, match=field):
    config_from_hf(qwen3_config(**{field: value}))


@pytest.mark.parametrize("field,value", [("mlp_only_layers", [1]), ("decoder_sparse_step", 2)])
def test_mixed_dense_and_moe_layers_are_refused(field, value):
  config = qwen3_moe_config()
  config[field] = value
  with pytest.raises(ValueError, match=f"{field}.*dense layers among MoE layers"):
    config_from_hf(config)


def test_both_config_spellings_are_accepted():
  v4 = dict(qwen3_moe_config(), rope_theta=5e6, rope_scaling={"type": "linear", "factor": 2.0}, num_experts=4)
  for key in ("rope_parameters", "num_local_experts", "head_dim"):
    v4.pop(key)
  v5 = dict(qwen3_moe_config(rope_parameters={"rope_theta": 5e6, "rope_type": "linear", "factor": 2.0}), head_dim=16)
  a, b = config_from_hf(v4), config_from_hf(v5)
  assert a == b and a.rope_theta == 5e6 and a.num_experts == 4 and a.head_dim == 64 // 4
  assert dict(a.rope_scaling) == {"rope_type": "linear", "factor": 2.0}
  yarn = config_from_hf(
    qwen3_config(max_position_embeddings=4096, rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0})
  )
  assert dict(yarn.rope_scaling)["original_max_position_embeddings"] == 4096


def test_convert_cli_refusal_is_one_line_exit_2_and_leaves_nothing(tmp_path, capsys):
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config(), drop=["model.norm.weight"])
  out = tmp_path / "out"
  assert cli.main(["jaxcredit", "convert", "--hf", str(folder), "--out", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "'model.norm.weight' is missing" in err and "Traceback" not in err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
  for args in (
    ["--hf", str(tmp_path / "nope"), "--out", str(out)],
    ["--hf", str(folder)],
    ["--gguf", str(tmp_path / "nope.gguf"), "--out", str(out)],
    ["--hf", str(folder), "--out", str(out), "--dtype", "int4"],
  ):
    assert cli.main(["jaxcredit", "convert", *args]) == 2, args
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("jaxcredit convert: error:"), err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config())
  calls = []
  real = hf_lib.read_tensor

  def flaky(info):
    calls.append(info.name)
    if len(calls) == 5:
      raise OSError("disk went away")
    return real(info)

  monkeypatch.setattr(hf_lib, "read_tensor", flaky)
  with pytest.raises(OSError, match="disk went away"):
    convert_hf(folder, tmp_path / "out")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_existing_output_and_missing_checkpoint_are_refused(tmp_path, capsys):
  folder = write_numpy_hf(tmp_path / "hf", qwen3_config())
  (tmp_path / "taken").mkdir()
  (tmp_path / "taken" / "x").write_text("keep me")
  assert cli.main(["jaxcredit", "convert", "--hf", str(folder), "--out", str(tmp_path / "taken")]) == 2
  assert "already exists" in capsys.readouterr().err
  assert (tmp_path / "taken" / "x").read_text() == "keep me"
  assert cli.main(["jaxcredit", "export", "--checkpoint", str(folder), "--out", str(tmp_path / "exp")]) == 2
  assert "not a converted checkpoint" in capsys.readouterr().err
  assert not (tmp_path / "exp").exists()
