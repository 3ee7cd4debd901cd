"""`jaxcredit plan`: the training step compiled for a TPU topology without a TPU (deviceless, through libtpu).

Skipped only where no libtpu is found (the README's test command installs one into .libtpu with
tools/install_libtpu.py; tests/conftest.py points TPU_LIBRARY_PATH at it).
"""

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxcredit import cli
from jaxcredit.train.commands import plan
from tests.fixtures.multidevice import run_on_devices
from tests.fixtures.tiny_model import tiny_decoder_config

needs_libtpu = pytest.mark.skipif(
  plan.libtpu_library_path() is None,
  reason="no libtpu: run python tools/install_libtpu.py (the README's test command does)",
)

TINY_MOE = tiny_decoder_config(
  vocab_size=512,
  hidden_size=128,
  intermediate_size=256,
  head_dim=64,
  qk_norm=True,
  num_experts=8,
  num_experts_per_tok=2,
  moe_intermediate_size=64,
  tie_word_embeddings=False,
  dtype="bfloat16",
  attention_impl="chunked",
  attention_chunk=128,
)


_shard_bytes = plan._shard_bytes  # per-device bytes of sharded ShapeDtypeStructs


def test_parse_topology_and_mesh():
  assert plan.parse_topology("v5p:4x4x4") == ("v5p", 64)
  assert plan.parse_mesh("fsdp=16,tensor=4") == {"fsdp": 16, "tensor": 4}
  with pytest.raises(ValueError, match="v5p:4x4x4"):
    plan.parse_topology("v7x-64")
  with pytest.raises(ValueError, match="pipeline=2"):
    plan.parse_mesh("fsdp=4,pipeline=2")
  with pytest.raises(ValueError, match="twice"):
    plan.parse_mesh("fsdp=4,fsdp=2")
  with pytest.raises(ValueError, match="sizes >= 1"):
    plan.parse_topology("v5e:0x2")
  # Issue 54: each generation's slices have its own number of axes.
  with pytest.raises(ValueError, match=r"a v5e slice is a 2-D torus \(e.g. v5e:4x4\), not 3-D"):
    plan.parse_topology("v5e:4x4x4")
  with pytest.raises(ValueError, match="a v5p slice is a 3-D torus"):
    plan.parse_topology("v5p:2x2")
  assert plan.parse_topology("v6e:16x16") == ("v6e", 256)


def test_plan_without_libtpu_refuses_a_slice_too_large_to_simulate(capsys, monkeypatch):
  """Issue 54: v5p:16x16x24 without libtpu ended in XLA's "Multiprocess computations aren't implemented"."""
  monkeypatch.setattr(plan, "libtpu_library_path", lambda: None)
  args = ["jaxcredit", "plan", "--config", "configs/plan_qwen3_4b.py", "--topology", "v5p:16x16x24"]
  assert cli.main(args) == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert "has 6144 chips: without libtpu the plan simulates them with CPU devices, at most 512" in err


RL_CFG = dataclasses.replace(TINY_MOE, param_dtype="float32")
"""TINY_MOE with float32 master weights and bfloat16 compute (the trainer's default)."""
RL_TEACHER = dataclasses.replace(TINY_MOE, num_layers=3)


@pytest.fixture(scope="module")
def rl_plan():
  """One compile for the two memory tests below: RL_CFG's step on v5p:2x2x2 with fsdp=2 x expert=4, the rest of the
  RL step (8 rollouts, a 300-slot cache, a 3-layer teacher) and an assumed step time of 0.5 s."""
  if plan.libtpu_library_path() is None:
    pytest.skip("no libtpu: run python tools/install_libtpu.py (the README's test command does)")
  rl = {"rollouts": 8, "cache_len": 300, "teacher_cfg": RL_TEACHER}
  return plan.plan_step(
    RL_CFG, topology="v5p:2x2x2", mesh={"fsdp": 2, "expert": 4}, batch_size=8, seq_len=256, step_time_s=0.5, rl=rl
  )


@needs_libtpu
def test_tpu_plan_memory_matches_the_arrays(rl_plan):
  report, cfg = rl_plan, RL_CFG
  assert report["is_tpu"] and report["chips"] == 8
  assert report["mesh"] == {"fsdp": 2, "expert": 4, "data": 1}
  # The arguments are the sharded parameters, AdamW moments and the batch: recompute them from the shapes.
  devices, _ = plan.topology_devices("v5p:2x2x2")
  from jaxcredit import sharding

  mesh = sharding.make_mesh(report["mesh"], devices)
  _, (params, opt_state, batch) = plan.abstract_step(cfg, mesh, batch_size=8, seq_len=256)
  expected = _shard_bytes((params, opt_state, batch))
  # TPU layouts pad small arrays to tiles; the arguments are at least the data and not wildly more.
  assert expected <= report["argument_bytes"] <= 2 * expected + 2**20, (expected, report["argument_bytes"])
  # Parameters and optimizer state are donated: the outputs alias them.
  assert report["alias_bytes"] >= _shard_bytes((params, opt_state)) - 2**16
  assert report["temp_bytes"] > 0
  assert report["peak_bytes"] == (
    report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
  )
  assert report["fits"]
  tokens = 8 * 256
  assert report["model_flops_per_device"] == pytest.approx(6 * cfg.num_params(active=True) * tokens / 8)
  assert report["mfu"] == pytest.approx(6 * cfg.num_params(active=True) * tokens / (0.5 * 8 * 459e12))


@needs_libtpu
def test_plan_cli_writes_a_report(tmp_path, capsys, monkeypatch):
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  (model_dir / "model_config.json").write_text(json.dumps(TINY_MOE.to_dict()))
  out = tmp_path / "plan.json"
  args = [
    "jaxcredit",
    "plan",
    "--config",
    "configs/plan_qwen3_30b_a3b.py",
    "--topology",
    "v5e:2x2",
    "--mesh",
    "fsdp=2,tensor=2",
    f"--json={out}",
    f"--config.model.source={model_dir}",
    "--config.plan.seq_len=128",
    "--config.model.attention_impl=full",
    f"--config.compilation_cache_dir={tmp_path / 'cache'}",
  ]
  code = cli.main(args)
  assert code == 0, capsys.readouterr().err
  report = json.loads(out.read_text())
  assert report["chips"] == 4 and report["mesh"] == {"fsdp": 2, "tensor": 2, "data": 1}
  assert report["batch_size"] == 2 and report["seq_len"] == 128
  assert report["hbm_bytes"] == 16 * 2**30
  assert not report["compile_cached"]
  assert "FITS" in capsys.readouterr().out

  # The same program again (only the assumed step time differs): read from the memo, not compiled; same numbers.
  assert cli.main([*args, "--config.plan.step_time_s=2"]) == 0, capsys.readouterr().err
  again = json.loads(out.read_text())
  assert again["compile_cached"] and "measured by an earlier compile" in capsys.readouterr().out
  keys = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes", "compiled_flops_per_device")
  assert {k: again[k] for k in keys} == {k: report[k] for k in keys}
  assert again["compile_s"] == report["compile_s"] and again["mfu"] > 0
  # Another program (a longer sequence) is not read from the memo: it goes to the compiler, stood in for here (the
  # first call above compiled for real); the memo key is the lowered program, so the memo cannot answer for it.
  compiled = []

  def measure(lowered):
    compiled.append(lowered)
    return {"arguments": 1, "outputs": 1, "aliased": 0, "temporaries": 1, "flops": 1.0, "refused": None}

  monkeypatch.setattr(plan, "_compile_and_measure", measure)
  assert cli.main([*args, "--config.plan.seq_len=256"]) == 0, capsys.readouterr().err
  longer = json.loads(out.read_text())
  assert not longer["compile_cached"] and longer["seq_len"] == 256 and len(compiled) == 1


def test_plan_cli_refuses_bad_topology_and_mesh(capsys):
  assert cli.main(["jaxcredit", "plan", "--config", "configs/plan_qwen3_4b.py", "--topology", "v9:2x2"]) == 2
  assert "--topology" in capsys.readouterr().err
  assert (
    cli.main(
      ["jaxcredit", "plan", "--config", "configs/plan_qwen3_4b.py", "--topology", "v5p:2x2x2", "--mesh", "fsdp=x"]
    )
    == 2
  )
  assert "fsdp=x" in capsys.readouterr().err
  assert (
    cli.main(
      [
        "jaxcredit",
        "plan",
        "--config",
        "configs/plan_qwen3_4b.py",
        "--topology",
        "v5p:2x2x2",
        "--json",
        "/nonexistent-dir/plan.json",
      ]
    )
    == 2
  )
  assert "--json" in capsys.readouterr().err
  assert (
    cli.main(
      [
        "jaxcredit",
        "plan",
        "--config",
        "configs/plan_qwen3_4b.py",
        "--topology",
        "v5p:2x2x2",
        "--config.plan.seq_len=-5",
      ]
    )
    == 2
  )
  assert "plan.seq_len" in capsys.readouterr().err


@needs_libtpu
def test_plan_cli_refuses_a_slice_libtpu_cannot_describe(capsys):
  assert cli.main(["jaxcredit", "plan", "--config", "configs/plan_qwen3_4b.py", "--topology", "v5p:3x3x3"]) == 2
  err = capsys.readouterr().err
  assert "v5p:3x3x3" in err and "libtpu" in err and "XLA_FLAGS" not in err


def test_plan_without_libtpu_simulates_the_chips_on_cpu_and_says_so():
  """The fallback: the same step compiled for a mesh of CPU devices, reported as an estimate."""
  out = run_on_devices("plan_estimate.py")
  assert "ESTIMATE" in out and "simulated mesh of CPU devices" in out
  assert "loss: policy; one rollout per row; policy term weighted by truncated importance weights" in out


@needs_libtpu
def test_the_rl_step_names_every_resident_part(rl_plan):
  """Float32 masters with bfloat16 compute: the update's arguments are masters + moments + batch; beside them sit
  the sampler's bfloat16 copy (on 2 hosts, each host's own) and the bfloat16 reference, and during sampling the KV
  cache of the host's rollouts."""
  report, cfg = rl_plan, RL_CFG
  q = report["rl_step"]
  devices, _ = plan.topology_devices("v5p:2x2x2")
  from jaxcredit import sharding

  mesh = sharding.make_mesh(report["mesh"], devices)
  _, (params, opt_state, batch) = plan.abstract_step(cfg, mesh, batch_size=8, seq_len=256)
  assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {np.dtype("float32")}
  assert q["policy_bytes"] == _shard_bytes(params)
  assert q["optimizer_bytes"] == _shard_bytes(opt_state)
  assert q["optimizer_bytes"] >= 2 * q["policy_bytes"]  # two float32 moments per float32 master
  # The reference: a bfloat16 copy of the same shards, half the masters.
  assert q["reference_bytes"] == q["policy_bytes"] // 2
  # v5p:2x2x2 is 2 hosts of 4 chips: each host samples from its own bfloat16 copy sharded over its 4 chips only
  # (the mesh divided by the hosts, outer axes first: fsdp 2 -> 1, expert 4), so a device holds more of it.
  assert q["hosts"] == 2
  mine = [d for d in devices if d.process_index == devices[0].process_index]
  host_mesh = sharding.make_mesh({"fsdp": 1, "expert": 4}, mine)
  assert q["sampler_weights_bytes"] == plan._shard_bytes(plan._abstract_params(cfg, host_mesh, np.dtype("bfloat16")))
  assert q["sampler_weights_bytes"] > q["reference_bytes"]
  assert report["argument_bytes"] >= q["policy_bytes"] + q["optimizer_bytes"] + _shard_bytes(batch)
  # The teacher: 3 of TINY_MOE's layers where the policy has 2, plus the same embedding and head.
  per_layer = (q["reference_bytes"] - _layerless_bytes(cfg, mesh)) // 2
  assert q["teacher_bytes"] == _layerless_bytes(cfg, mesh) + 3 * per_layer
  # Keys and values of 2 layers x 4 rollouts (a host's half) x 300 slots x 2 kv heads x 64, bfloat16, the rollouts
  # over the host's expert axis (4 chips).
  assert q["kv_cache_bytes"] == 2 * 2 * 4 * 300 * 2 * 64 * 2 // 4
  beside = q["reference_bytes"] + q["teacher_bytes"]  # the sampler's copy is released during the update
  assert q["update_phase_bytes"] == report["peak_bytes"] + beside
  assert (
    q["sampling_phase_bytes"]
    == q["policy_bytes"] + q["optimizer_bytes"] + beside + q["sampler_weights_bytes"] + q["kv_cache_bytes"]
  )
  assert q["peak_bytes"] == max(q["update_phase_bytes"], q["sampling_phase_bytes"])


def _layerless_bytes(cfg, mesh) -> int:
  """Per-device bfloat16 bytes of the embedding, final norm and head (the parameters outside the layer stack)."""
  import dataclasses

  one = plan._shard_bytes(plan._abstract_params(dataclasses.replace(cfg, num_layers=1), mesh, np.dtype("bfloat16")))
  two = plan._shard_bytes(plan._abstract_params(dataclasses.replace(cfg, num_layers=2), mesh, np.dtype("bfloat16")))
  return one - (two - one)


def test_attention_flops_are_counted_apart():
  from jaxcredit.models.presets import preset

  cfg = preset("qwen3-4b")
  attn = plan.attention_flops(cfg, 32, 32768)
  assert attn == 6 * 36 * 32 * 128 * 32768 * 32 * 32768
  # At 32k tokens attention's FLOPs exceed the 6·N·tokens of Qwen3-4B's weights (the "about half" of the
  # total), so an MFU without them understates the work by more than half.
  ratio = attn / (6 * cfg.num_params(active=True) * 32 * 32768)
  assert 1.1 < ratio < 1.3, ratio


def test_with_rollouts_sampled_ahead_the_sampler_keeps_its_own_copy_and_cache_through_the_update():
  """One host, parameters stored in the compute dtype: the synchronous sampler reads the policy's own arrays (no
  copy); with `rollout.async_depth` it holds a copy (the update donates the policy's buffers), and the copy and
  the KV cache stay resident while the update runs."""
  from jaxcredit import sharding

  cfg = tiny_decoder_config(dtype="float32")
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  sync = plan.rl_step_memory(cfg, mesh, rollouts=4, cache_len=64)
  ahead = plan.rl_step_memory(cfg, mesh, rollouts=4, cache_len=64, async_depth=1)
  assert sync["sampler_weights_bytes"] == 0 and sync["async_depth"] == 0
  assert ahead["sampler_weights_bytes"] == ahead["reference_bytes"] > 0
  assert ahead["kv_cache_bytes"] == sync["kv_cache_bytes"] > 0


def test_the_planned_update_is_the_methods_loss_on_packed_rows():
  """`jaxcredit plan` lowers the update the trainer runs: the method's loss terms read their arrays, and with
  packing the per-token arrays sit at K scored slots per row beside the row layout."""
  from jaxcredit import sharding
  from jaxcredit.train.loop import step as step_lib

  cfg = tiny_decoder_config(dtype="float32")
  mesh = sharding.make_mesh({"fsdp": 1}, jax.devices()[:1])
  loss_cfg = step_lib.PolicyLossConfig(
    terms=("policy", "distill"), knob_weights=(("distill_coef", 0.5),), kl_coef=0.1, max_len=64
  )
  update, (params, opt_state, batch) = plan.abstract_step(
    cfg, mesh, batch_size=2, seq_len=64, loss_cfg=loss_cfg, packed_slots=32, behavior_weights=True
  )
  assert batch.tokens_NxL.shape == batch.packed.positions_NxL.shape == batch.packed.prefix_limit_NxL.shape == (2, 64)
  per_slot = {"adv": batch.adv_NxK, "ref_logp": batch.ref_logp_NxK, "behavior_weight": batch.behavior_weight_NxK}
  per_slot.update(batch.inputs_NxK)
  assert set(per_slot) == {"adv", "ref_logp", "behavior_weight", "distill_weight", "distill_target"}
  for key, value in per_slot.items():
    assert value.shape == (2, 32), key  # the policy, KL and distillation terms' arrays, at the scored slots
  assert batch.packed.slots_NxK.shape == batch.packed.rollout_ids_NxK.shape == (2, 32)
  assert batch.packed.rollouts_N.shape == (2,)
  text = update.lower(params, opt_state, batch).as_text()
  assert len(text) > 1000
  _, (_, _, plain) = plan.abstract_step(cfg, mesh, batch_size=2, seq_len=64)
  present = {k for k, v in vars(plain).items() if v is not None and v != {}}
  assert present == {"tokens_NxL", "token_mask_NxL", "action_mask_NxK", "behavior_logp_NxK", "adv_NxK"}
