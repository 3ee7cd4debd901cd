"""Will this training step fit? Compile it ahead of time for a TPU topology, on a machine without a TPU.

`plan_step` builds the policy-gradient update (the one `jaxcredit train` runs: decoder forward + chunked log-probs,
PPO-clip and the method's own loss terms with the arrays they read, the packed rows of `train.pack_rollouts` where
the trainer would pack, the importance weights of an external engine or `rollout.async_depth`, AdamW,
micro-batches; `jaxcredit plan --config` takes them from the config) on abstract arrays – no weights are materialised – with the parameters,
optimizer state and batch sharded by `jaxcredit.sharding`'s table over a mesh of the topology's devices, then
`jax.jit(...).lower(...).compile()`s it. libtpu compiles for TPU devices described by `jax.experimental.topologies.get_topology_desc`; the compiled executable reports the per-device
memory (arguments, outputs, temporaries) and the FLOPs XLA counted. libtpu is found as JAX finds it: the file
named by `TPU_LIBRARY_PATH` (what `python tools/install_libtpu.py` installs, outside site-packages, so that other
JAX processes on the machine never try a TPU runtime), else an installed `libtpu` package (the `tpu` extra).

Without libtpu the same step is compiled for a simulated mesh of CPU devices (XLA_FLAGS
--xla_force_host_platform_device_count, set by the CLI before JAX starts): the numbers are then an estimate, and
the report says so.

    from jaxcredit.train.commands import plan
    report = plan.plan_step(preset("qwen3-4b"), topology="v5p:2x4x4", mesh={"fsdp": 32}, batch_size=32,
                            seq_len=32768, num_micro_batches=1)
    print(plan.format_report(report))
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcredit import multihost, sharding
from jaxcredit.atomic_files import write_json_atomic
from jaxcredit.models.config import ModelConfig
from jaxcredit.models.decoder import Decoder, param_logical_axes
from jaxcredit.topology import CHIPS, DEVICE_KINDS, parse_mesh, parse_topology, peak_flops_per_chip  # noqa: F401
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.loop import update as update_lib


def libtpu_library_path() -> str | None:
  """Where JAX will load libtpu from for a deviceless compile, or None when it cannot.

  The order is JAX's own (`jax._src.cloud_tpu_init.get_tpu_library_path`): `TPU_LIBRARY_PATH` when it names a file,
  else the installed `libtpu` package's library. Reads no JAX state, so it may run before JAX starts its backends.
  """
  path = os.environ.get("TPU_LIBRARY_PATH")
  if path and os.path.isfile(path):
    return path
  import importlib.util

  spec = importlib.util.find_spec("libtpu")
  if spec is None or not spec.submodule_search_locations:
    return None
  lib = os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
  return lib if os.path.isfile(lib) else None


def topology_devices(topology: str) -> tuple[list, bool]:
  """The devices of a TPU topology from libtpu (deviceless), or (fallback) the local CPU devices.

  Returns:
    (devices, is_tpu).
  """
  global last_topology_error
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) unless told otherwise; a deviceless compile touches
  # no chip, so two plans (or a plan and the tests) may run at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices), True
  except Exception as e:  # no libtpu, or it cannot describe this topology
    last_topology_error = " ".join(str(e).split())[:300]
    if libtpu_library_path() is not None:
      raise ValueError(f"--topology {topology!r} is not a TPU slice libtpu can describe: {last_topology_error}")
    return list(jax.devices("cpu")), False


last_topology_error = ""  # why the last `topology_devices` call fell back to CPU devices


def abstract_step(
  cfg: ModelConfig,
  mesh,
  *,
  batch_size: int,
  seq_len: int,
  num_micro_batches: int = 1,
  learning_rate: float = 1e-6,
  loss_cfg: step_lib.PolicyLossConfig | None = None,
  packed_slots: int = 0,
  behavior_weights: bool = False,
):
  """The jitted update and the abstract (sharded ShapeDtypeStruct) arguments to lower it with: the batch the trainer
  builds for this loss, from its own builders under `jax.eval_shape` (`update.abstract_update_batch`).

  Args:
    loss_cfg: the loss `train.update.loss_config_of(config)` builds (its active terms decide the batch's arrays:
      the reference's log-probs for the KL term, the distillation weights and targets, ...); default: PPO-clip alone.
    packed_slots: K > 0: the packed layout (`UpdateBatch.packed`): batch_size rows of seq_len slots, the per-slot
      arrays at K scored slots per row; 0: one right-padded rollout per row.
    behavior_weights: the truncated importance weights of an external engine or `rollout.async_depth`.

  Returns:
    (update: step.MeshJit, (params, opt_state, batch) abstract).
  """
  loss_cfg = step_lib.PolicyLossConfig() if loss_cfg is None else loss_cfg
  abstract_model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  graphdef, params, rest = step_lib.split_model(abstract_model)
  p_sh = sharding.param_shardings(params, mesh, param_logical_axes(cfg))
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, p_sh)
  optimizer = step_lib.make_optimizer(learning_rate)
  opt_sh = step_lib.opt_state_shardings(optimizer, params, p_sh, mesh)
  opt_state = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), jax.eval_shape(optimizer.init, params), opt_sh
  )
  abstract = update_lib.abstract_update_batch(
    loss_cfg,
    batch_size=batch_size,
    seq_len=seq_len,
    hidden_size=cfg.hidden_size,
    packed_slots=packed_slots,
    behavior_weights=behavior_weights,
  )
  batch = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding.batch_sharding(mesh, x.ndim)), abstract
  )
  update = step_lib.make_update_fn(
    step_lib.pg_token_loss,
    graphdef,
    rest,
    optimizer,
    loss_cfg,
    mesh,
    p_sh,
    opt_sh,
    num_micro=num_micro_batches,
  )
  return update, (params, opt_state, batch)


def _shard_bytes(tree) -> int:
  """Per-device bytes of a pytree of sharded ShapeDtypeStructs (the largest shard; shards are equal here)."""
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    total += math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
  return total


def _abstract_params(cfg: ModelConfig, mesh, dtype, rules=None):
  abstract_model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  _, params, _ = step_lib.split_model(abstract_model)
  p_sh = sharding.param_shardings(params, mesh, param_logical_axes(cfg), rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, dtype, sharding=s), params, p_sh)


def rl_step_memory(
  cfg: ModelConfig,
  mesh,
  *,
  rollouts: int,
  cache_len: int,
  teacher_cfg: ModelConfig | None = None,
  teacher_rules=None,
  async_depth: int = 0,
) -> dict[str, int]:
  """Per-device bytes of what an RL step keeps on the chips besides the update's own arguments and temporaries.

  Args:
    cfg: the policy (parameters stored in cfg.param_dtype, computed in cfg.dtype).
    mesh: the mesh.
    rollouts: rollouts sampled per step (prompts_per_step x group_size): the KV cache's batch.
    cache_len: the sampler's cache slots per rollout (max_len + prompt_bucket + chunk_size).
    teacher_cfg: a teacher checkpoint's model, when the method loads one; its own table `teacher_rules`.
    async_depth: `rollout.async_depth`; above 0 the sampler always holds its own copy (the update donates the
      policy's buffers while the rollout thread samples) and, with the KV cache, keeps it through the update.

  Returns:
    async_depth, and per device: policy_bytes (master weights), optimizer_bytes (AdamW moments and count),
    sampler_weights_bytes (the sampler's compute-dtype copy; 0 when the parameters are stored in it on one host
    and the loop is synchronous; on several hosts each host's own copy, sharded over its chips only: `config.mesh`
    divided by the host count, as the trainer samples),
    reference_bytes (the frozen reference, compute dtype; the trainer always keeps one), teacher_bytes,
    kv_cache_bytes (keys and values of every layer for the host's share of the rollouts, sharded over the batch
    axes and the kv heads over tensor where they divide), each per device; and hosts (processes: the mesh's
    devices' distinct process indices).

  Raises:
    ValueError: `rollouts` or the mesh can't be split over the hosts (as the trainer refuses them).
  """
  compute = jnp.dtype(cfg.dtype)
  devices = list(mesh.devices.flat)
  hosts = len({d.process_index for d in devices})
  sample_mesh = mesh
  if hosts > 1:  # each host samples its share of the rollouts on its own chips, from its own copy of the policy
    if rollouts % hosts:
      raise ValueError(f"{rollouts} rollouts per step can't be split evenly over {hosts} hosts")
    mine = [d for d in devices if d.process_index == devices[0].process_index]
    sample_mesh = sharding.make_mesh(multihost.local_mesh_shape(dict(mesh.shape), hosts), mine)
    rollouts //= hosts
  masters = _abstract_params(cfg, mesh, cfg.jnp_param_dtype)
  p_sh = jax.tree.map(lambda x: x.sharding, masters)
  optimizer = step_lib.make_optimizer(1e-6)
  opt_sh = step_lib.opt_state_shardings(optimizer, masters, p_sh, mesh)
  opt_state = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), jax.eval_shape(optimizer.init, masters), opt_sh
  )
  reference = _abstract_params(cfg, mesh, compute)
  teacher = 0
  if teacher_cfg is not None:
    teacher = _shard_bytes(_abstract_params(teacher_cfg, mesh, jnp.dtype(teacher_cfg.dtype), teacher_rules))
  kv_shape = (cfg.num_layers, rollouts, cache_len, cfg.num_kv_heads, cfg.head_dim)
  kv_spec = sharding.logical_to_spec(
    ("layers", "activation_batch", "activation_length", "activation_kv_heads", "head_dim"),
    kv_shape,
    dict(sample_mesh.shape),
  )
  kv = jax.ShapeDtypeStruct(kv_shape, compute, sharding=jax.sharding.NamedSharding(sample_mesh, kv_spec))
  if hosts > 1:
    sampler_weights = _shard_bytes(_abstract_params(cfg, sample_mesh, compute))
  else:
    sampler_weights = 0 if cfg.jnp_param_dtype == compute and not async_depth else _shard_bytes(reference)
  return {
    "hosts": hosts,
    "async_depth": int(async_depth),
    "policy_bytes": _shard_bytes(masters),
    "optimizer_bytes": _shard_bytes(opt_state),
    "sampler_weights_bytes": sampler_weights,
    "reference_bytes": _shard_bytes(reference),
    "teacher_bytes": teacher,
    "kv_cache_bytes": 2 * _shard_bytes(kv),
  }


def attention_flops(cfg: ModelConfig, batch_size: int, seq_len: int) -> float:
  """Training FLOPs of causal attention's two matrix products (QKᵀ and PV), forward and backward, for a step of
  batch_size x seq_len tokens: 6 · layers · heads · head_dim · seq_len · tokens (2 FLOPs per multiply-add, two
  products, causal halving, backward twice the forward). Not in 6·N·tokens; at 32k tokens Qwen3-4B's is 1.2x it."""
  return 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len * batch_size * seq_len


def plan_step(
  cfg: ModelConfig,
  *,
  topology: str,
  mesh: Mapping[str, int],
  batch_size: int,
  seq_len: int,
  num_micro_batches: int = 1,
  step_time_s: float | None = None,
  devices=None,
  rl: Mapping[str, Any] | None = None,
  memo_dir: str | None = None,
  loss_cfg: step_lib.PolicyLossConfig | None = None,
  packed_slots: int = 0,
  behavior_weights: bool = False,
) -> dict[str, Any]:
  """Compiles the training step for `topology` and reports memory, FLOPs and the MFU a step time implies.

  Args:
    cfg: the model (e.g. `jaxcredit.models.presets.preset("qwen3-4b", remat=True)`).
    topology: e.g. "v5p:4x4x4" (generation:chip grid).
    mesh: axis sizes; the data axis takes the chips the others leave.
    batch_size: sequences per step (global); must divide by data*fsdp*expert.
    seq_len: tokens per sequence.
    num_micro_batches: gradient-accumulation micro-batches inside the step.
    step_time_s: an assumed step time, for the implied MFU (default: none).
    devices: override the devices (tests); default `topology_devices(topology)`.
    rl: the rest of the RL step, `rl_step_memory`'s keyword arguments (rollouts, cache_len, teacher_cfg,
      teacher_rules); the report then names each part resident on a chip and the RL step's peak.
    memo_dir: a folder for what compiles measured (memory, FLOPs, a compiler refusal), keyed by the lowered
      program, the devices and the jax version: a program compiled before (another method's config with the same
      model, mesh and batch; a rerun with another step_time_s) is not compiled again, and the report says
      `compile_cached`. None: always compile. (JAX's own persistent cache cannot serve deviceless TPU compiles.)
    loss_cfg, packed_slots, behavior_weights: the update's loss terms and batch layout (`abstract_step`); default
      PPO-clip alone on unpacked rows.

  Returns:
    A dict: topology, chips, is_tpu (False: simulated CPU mesh, an estimate), mesh, per-device memory bytes
    (arguments, outputs, aliased, temporaries, peak = arguments + outputs - aliased + temporaries), hbm_bytes,
    fits, compiled_flops_per_device, model_flops_per_device (6·N_active·tokens / chips), compile_s, and with
    step_time_s the implied MFU (model FLOPs / (step time · chips · peak)).

  Raises:
    ValueError: a mesh that does not divide the chips, or a batch that does not divide the batch axes.
  """
  generation, chips = parse_topology(topology)
  if devices is None:
    devices, is_tpu = topology_devices(topology)
  else:
    is_tpu = devices[0].platform == "tpu"
  if is_tpu and len(devices) != chips:
    raise ValueError(f"topology {topology} has {len(devices)} devices, expected {chips}")
  n = len(devices) if is_tpu else chips
  fixed = math.prod(v for k, v in mesh.items() if k != "data")
  if n % fixed:
    raise ValueError(f"--mesh {dict(mesh)} needs a multiple of {fixed} chips; {topology} has {n}")
  shape = dict(mesh)
  shape.setdefault("data", n // fixed)
  if math.prod(shape.values()) != n:
    raise ValueError(f"--mesh {shape} uses {math.prod(shape.values())} chips; {topology} has {n}")
  if not is_tpu and len(devices) < n:
    raise ValueError(
      f"libtpu is not installed, and only {len(devices)} CPU devices are there to simulate {n} "
      f"chips: run with XLA_FLAGS=--xla_force_host_platform_device_count={n} (the CLI sets it), or "
      f"point TPU_LIBRARY_PATH at a libtpu (python tools/install_libtpu.py) for real TPU numbers"
    )
  m = sharding.make_mesh(shape, devices[:n])
  dp = shape.get("data", 1) * shape.get("fsdp", 1) * shape.get("expert", 1)
  if batch_size % (dp * num_micro_batches):
    raise ValueError(
      f"batch_size {batch_size} must divide by data*fsdp*expert ({dp}) x micro-batches ({num_micro_batches})"
    )
  rl_parts = rl_step_memory(cfg, m, **rl) if rl is not None else None
  t0 = time.time()
  update, args = abstract_step(
    cfg,
    m,
    batch_size=batch_size,
    seq_len=seq_len,
    num_micro_batches=num_micro_batches,
    loss_cfg=loss_cfg,
    packed_slots=packed_slots,
    behavior_weights=behavior_weights,
  )
  lowered = update.lower(*args)
  memo_path = _memo_path(memo_dir, lowered, devices[:n]) if memo_dir else None
  measured = _read_memo(memo_path)
  if measured is None:
    measured = _compile_and_measure(lowered)
    measured["compile_s"] = time.time() - t0
    _write_memo(memo_path, measured)
  report = _report(
    cfg, topology, generation, n, is_tpu, shape, batch_size, seq_len, num_micro_batches, step_time_s, measured, rl_parts
  )
  report["compile_cached"] = bool(measured.get("cached", False))
  report["loss_terms"] = list(step_lib.loss_terms(step_lib.PolicyLossConfig() if loss_cfg is None else loss_cfg))
  report["packed_slots"] = int(packed_slots)
  report["behavior_weights"] = bool(behavior_weights)
  return report


def _compile_and_measure(lowered) -> dict[str, Any]:
  """Compiles `lowered` and reads its per-device memory (bytes) and FLOPs; a compiler refusal for HBM is a result
  (temporaries from its message, `refused` the message), any other compile error is raised."""
  try:
    compiled = lowered.compile()
  except Exception as e:  # the TPU compiler refuses a program whose temporaries exceed HBM
    match = re.search(r"HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)", str(e))
    if "RESOURCE_EXHAUSTED" not in str(e) or not match:
      raise
    unit = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    temp = float(match.group(1)) * unit[match.group(2)]
    return dict(
      arguments=-1,
      outputs=-1,
      aliased=-1,
      temporaries=int(temp),
      flops=float("nan"),
      refused=" ".join(str(e).split())[:400],
    )
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return dict(
    arguments=int(mem.argument_size_in_bytes),
    outputs=int(mem.output_size_in_bytes),
    aliased=int(mem.alias_size_in_bytes),
    temporaries=int(mem.temp_size_in_bytes),
    flops=float(cost.get("flops", float("nan"))) if cost else float("nan"),
    refused=None,
  )


def _memo_path(memo_dir: str, lowered, devices) -> str:
  """The memo file of this program on these devices: a hash of the lowered StableHLO, the devices' platform, kind
  and count, the jax version and the TPU library in use."""
  import hashlib

  key = hashlib.sha256()
  for part in (
    lowered.as_text(),
    devices[0].platform,
    str(getattr(devices[0], "device_kind", "")),
    str(len(devices)),
    jax.__version__,
    os.environ.get("TPU_LIBRARY_PATH", ""),
  ):
    key.update(part.encode("utf-8") + b"\0")
  return os.path.join(os.path.expanduser(memo_dir), f"plan-{key.hexdigest()[:32]}.json")


def _read_memo(path: str | None) -> dict[str, Any] | None:
  if not path or not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      measured = json.load(f)
  except (OSError, ValueError):
    return None  # unreadable: compile again (and write it afresh)
  if not isinstance(measured, dict) or not {"arguments", "temporaries", "compile_s"} <= set(measured):
    return None
  measured = {**measured, "flops": float(measured.get("flops", float("nan"))), "cached": True}
  measured.setdefault("refused", None)
  return measured


def _write_memo(path: str | None, measured: Mapping[str, Any]) -> None:
  if not path:
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  write_json_atomic(path, {**measured, "flops": str(measured["flops"])}, indent=None)  # NaN as a string: valid JSON


def _report(
  cfg, topology, generation, n, is_tpu, shape, batch_size, seq_len, num_micro_batches, step_time_s, measured, rl_parts
) -> dict[str, Any]:
  """plan_step's report from its arguments, the `measured` dict of `_compile_and_measure` (or `_read_memo`, with
  compile_s) and the RL step's parts (None: not asked)."""
  arguments, outputs, aliased, temporaries = (measured[k] for k in ("arguments", "outputs", "aliased", "temporaries"))
  flops, compile_s, refused = measured["flops"], measured["compile_s"], measured["refused"]
  peak = arguments + outputs - aliased + temporaries if refused is None else temporaries
  tokens = batch_size * seq_len
  model_flops = 6 * cfg.num_params(active=True) * tokens
  hbm = CHIPS[generation]["hbm_bytes"]
  report = {
    "topology": topology,
    "generation": generation,
    "chips": n,
    "is_tpu": is_tpu,
    "mesh": shape,
    "model": {
      "num_params": cfg.num_params(),
      "active_params": cfg.num_params(active=True),
      "num_layers": cfg.num_layers,
      "remat": cfg.remat,
      "remat_policy": cfg.remat_policy if cfg.remat else None,
      "dtype": cfg.dtype,
      "param_dtype": cfg.param_dtype or cfg.dtype,
      "attention_impl": cfg.attention_impl,
      "moe_impl": cfg.moe_impl if cfg.is_moe else None,
    },
    "batch_size": batch_size,
    "seq_len": seq_len,
    "num_micro_batches": num_micro_batches,
    "tokens": tokens,
    "argument_bytes": arguments,
    "output_bytes": outputs,
    "alias_bytes": aliased,
    "temp_bytes": temporaries,
    "peak_bytes": peak,
    "hbm_bytes": hbm,
    "fits": refused is None and peak <= hbm,
    "compiled_flops_per_device": flops,
    "model_flops_per_device": model_flops / n,
    "peak_flops_per_chip": CHIPS[generation]["peak_flops"],
    "compile_s": compile_s,
  }
  if refused is not None:
    report["compiler_refused"] = refused
  attn = attention_flops(cfg, batch_size, seq_len)
  report["attention_flops_per_device"] = attn / n
  peak_flops = n * CHIPS[generation]["peak_flops"]
  if step_time_s:
    report["step_time_s"] = step_time_s
    report["mfu"] = model_flops / (step_time_s * peak_flops)
    report["mfu_with_attention"] = (model_flops + attn) / (step_time_s * peak_flops)
  report["step_time_at_mfu_1.0_s"] = model_flops / peak_flops
  report["step_time_with_attention_at_mfu_1.0_s"] = (model_flops + attn) / peak_flops
  if rl_parts is not None:
    # During the update: its own peak (the policy and optimizer state are its arguments) plus what stays resident
    # beside it (the sampler's copy is released before the update; with rollout.async_depth the rollout thread
    # samples the next step meanwhile, so its copy and KV cache stay). During sampling: everything resident, the
    # sampler's copy and the KV cache of the rollouts.
    beside = rl_parts["reference_bytes"] + rl_parts["teacher_bytes"]
    resident = rl_parts["policy_bytes"] + rl_parts["optimizer_bytes"] + beside
    sampling = rl_parts["sampler_weights_bytes"] + rl_parts["kv_cache_bytes"]
    update_phase = (peak if refused is None else temporaries + resident - beside) + beside
    if rl_parts.get("async_depth", 0) > 0:
      update_phase += sampling
    sampling_phase = resident + sampling
    rl_peak = max(update_phase, sampling_phase)
    report["rl_step"] = {
      **rl_parts,
      "update_phase_bytes": update_phase,
      "sampling_phase_bytes": sampling_phase,
      "peak_bytes": rl_peak,
      "fits": refused is None and rl_peak <= hbm,
    }
  return report


def _gib(x: float) -> str:
  return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.1f} MiB"


def _count(n: float) -> str:
  return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _policy(model: Mapping[str, Any]) -> str:
  """The remat policy in parentheses, for the report's remat=True (empty for remat=False and older reports)."""
  return f" ({model['remat_policy']})" if model.get("remat_policy") else ""


def format_report(r: Mapping[str, Any]) -> str:
  """A human-readable summary of `plan_step`'s report."""
  where = (
    "compiled for TPU (libtpu, deviceless)"
    if r["is_tpu"]
    else "ESTIMATE: no libtpu, compiled for a simulated mesh of CPU devices (XLA:CPU memory and FLOPs)"
  )
  lines = [
    f"plan: {r['topology']} ({r['chips']} chips), mesh {r['mesh']} - {where}",
    f"  model: {_count(r['model']['num_params'])} params ({_count(r['model']['active_params'])} active), "
    f"{r['model']['num_layers']} layers, {r['model']['dtype']} compute, {r['model'].get('param_dtype', r['model']['dtype'])} parameters, remat={r['model']['remat']}{_policy(r['model'])}, "
    f"attention={r['model']['attention_impl']}" + (f", moe={r['model']['moe_impl']}" if r['model']['moe_impl'] else ""),
    f"  batch: {r['batch_size']} x {r['seq_len']} tokens = {r['tokens']:,} tokens/step, "
    f"{r['num_micro_batches']} micro-batch(es)",
    f"  loss: {' + '.join(r.get('loss_terms', ['policy']))}"
    + (
      f"; packed rows, the output head on {r['packed_slots']} scored slots per row"
      if r.get("packed_slots")
      else "; one rollout per row"
    )
    + (
      "; policy term weighted by truncated importance weights (engine or async rollouts)"
      if r.get("behavior_weights")
      else ""
    ),
  ]
  if "compiler_refused" in r:
    lines += [
      f"  DOES NOT FIT: the TPU compiler needs {_gib(r['temp_bytes'])} of temporaries per chip, "
      f"{_gib(r['hbm_bytes'])} HBM ({r['compiler_refused'][:160]}...)",
      f"  compile attempt took {r['compile_s']:.1f} s"
      + (" (an earlier one, remembered)" if r.get("compile_cached") else ""),
    ]
    return "\n".join(lines)
  lines += [
    f"  per-device memory: arguments {_gib(r['argument_bytes'])}, outputs {_gib(r['output_bytes'])} "
    f"(aliased {_gib(r['alias_bytes'])}), temporaries {_gib(r['temp_bytes'])}",
    f"  peak {_gib(r['peak_bytes'])} of {_gib(r['hbm_bytes'])} HBM: {'FITS' if r['fits'] else 'DOES NOT FIT'}",
    f"  FLOPs per device per step: compiled {r['compiled_flops_per_device']:.3e}, "
    f"6*N_active*tokens/chips {r['model_flops_per_device']:.3e}",
    f"  step time at 100% MFU: {r['step_time_at_mfu_1.0_s']:.2f} s (at 40%: {r['step_time_at_mfu_1.0_s'] / 0.4:.2f} s)",
  ]
  if "mfu" in r:
    lines.append(
      f"  a {r['step_time_s']:.2f} s step would be {100 * r['mfu']:.1f}% MFU "
      f"({r['peak_flops_per_chip'] / 1e12:.0f} TFLOP/s bf16 peak per chip); "
      f"{100 * r['mfu_with_attention']:.1f}% counting attention's FLOPs"
    )
  if "attention_flops_per_device" in r:
    lines.append(
      f"  attention FLOPs per device {r['attention_flops_per_device']:.3e} "
      f"({r['attention_flops_per_device'] / r['model_flops_per_device']:.2f}x 6*N*tokens): step at 100% with "
      f"attention {r['step_time_with_attention_at_mfu_1.0_s']:.2f} s (at 40%: "
      f"{r['step_time_with_attention_at_mfu_1.0_s'] / 0.4:.2f} s)"
    )
  if "rl_step" in r:
    q = r["rl_step"]
    lines += [
      f"  RL step per device: policy {_gib(q['policy_bytes'])}, optimizer {_gib(q['optimizer_bytes'])}, "
      f"sampler weights {_gib(q['sampler_weights_bytes'])}"
      + (f" (each of {q['hosts']} hosts' own copy)" if q.get("hosts", 1) > 1 else "")
      + f", reference {_gib(q['reference_bytes'])}, "
      f"teacher {_gib(q['teacher_bytes'])}, KV cache {_gib(q['kv_cache_bytes'])}",
      f"  RL step peak {_gib(q['peak_bytes'])} (update {_gib(q['update_phase_bytes'])}"
      + (", the rollout thread sampling beside it" if q.get("async_depth") else "")
      + f", sampling "
      f"{_gib(q['sampling_phase_bytes'])}) of {_gib(r['hbm_bytes'])}: {'FITS' if q['fits'] else 'DOES NOT FIT'}",
    ]
  compiled = (
    f"measured by an earlier compile of the same program ({r['compile_s']:.1f} s; config.compilation_cache_dir)"
    if r.get("compile_cached")
    else f"compiled in {r['compile_s']:.1f} s"
  )
  lines.append(
    f"  {compiled}. XLA's FLOP count takes each loop body once (the scanned "
    f"layers, attention blocks, micro-batches): use 6*N*tokens for MFU"
  )
  return "\n".join(lines)


def model_config_for(source: str, config=None) -> ModelConfig:
  """The ModelConfig of `config.model.source` without loading weights: "preset:NAME", a converted checkpoint or
  Hugging Face folder, a GGUF file, or "smollm2"; with the config's numerics overrides applied.

  Raises:
    ValueError / FileNotFoundError: a source that names no model.
  """
  import json

  from jaxcredit.models import presets

  if source.startswith("preset:") or source.lower() in presets.PRESETS or source in presets.HUB_IDS:
    cfg = presets.preset(source)  # a Hub id in presets.HUB_IDS: its config.json, without a download
  else:
    from jaxcredit.models import resolve_source

    try:
      path = resolve_source(source, patterns=("config.json",))  # a Hub id: its config is all a plan needs
    except FileNotFoundError as e:
      raise FileNotFoundError(
        f"config.model.source {source!r} is not a preset ({sorted(presets.PRESETS)}), "
        f"a checkpoint folder, a GGUF file or a Hub id ({e})"
      ) from None
    if (path / "model_config.json").is_file():
      stored = json.loads((path / "model_config.json").read_text())
      if not isinstance(stored, dict):
        raise ValueError(f"{path / 'model_config.json'} must hold a JSON object")
      cfg = ModelConfig.from_dict(stored)
    elif (path / "config.json").is_file():
      from jaxcredit.models.hf_config import config_from_hf

      cfg = config_from_hf(json.loads((path / "config.json").read_text()))
    elif path.is_file():
      from jaxcredit.models.gguf_loader import config_from_metadata, gguf_metadata, open_gguf

      reader = open_gguf(path)
      has_output = any(t.name == "output.weight" for t in reader.tensors)
      cfg = config_from_metadata(gguf_metadata(reader), has_output)
    else:
      raise FileNotFoundError(
        f"config.model.source {source!r} is not a preset ({sorted(presets.PRESETS)}), "
        f"a checkpoint folder or a GGUF file"
      )
  if config is not None:
    from jaxcredit.train.loop.run import model_overrides

    cfg = model_overrides(cfg, config)
    if config.model.compute_dtype:
      cfg = dataclasses.replace(cfg, dtype=config.model.compute_dtype)
    cfg = dataclasses.replace(cfg, param_dtype=config.model.param_dtype)
  return cfg


def run_plan(config, topology: str, mesh_spec: str) -> dict[str, Any]:
  """`jaxcredit plan`: the report for config.model on `topology` with `--mesh`, printed and returned.

  Batch: config.plan.batch_size sequences (0: one per data-parallel shard, times train.num_micro_batches) of
  config.plan.seq_len tokens (0: sampling.max_len).
  """
  from jaxcredit.train.config import validate

  validate(config)
  caps = unwinnable_tasks(config)
  with sharding.use_rules(dict(config.sharding_rules)):
    report = _run_plan(config, topology, mesh_spec)
  if caps is not None:
    report["unwinnable_tasks"] = caps
  return report


def unwinnable_tasks(config) -> dict[str, dict[str, int]] | None:
  """The environment's tasks that ground-truth play cannot finish under the config's caps, printed and returned as
  split -> reason -> count (`run.report_unwinnable`); None when the environment's data is not installed here (a plan
  compiles without it: the line then says so)."""
  from jaxcredit.envs import make_env_spec
  from jaxcredit.train.loop.run import report_unwinnable

  try:
    env = make_env_spec(config.env)
    tasks = {
      "train": env.make_tasks("train", config.env.num_train_tasks, config.seed),
      "eval": env.make_tasks("eval", config.eval.num_tasks, None),
    }
  except ImportError as e:
    print(f"[jaxcredit] caps not checked: environment {config.env.name!r} needs {e}", flush=True)
    return None
  return report_unwinnable(env, tasks)


def _run_plan(config, topology: str, mesh_spec: str) -> dict[str, Any]:
  cfg = model_config_for(config.model.source, config)
  mesh = parse_mesh(mesh_spec)
  generation, chips = parse_topology(topology)
  micro = int(config.train.num_micro_batches)
  fixed = math.prod(v for k, v in mesh.items() if k != "data")
  dp = (chips // fixed if chips % fixed == 0 else 1) * mesh.get("fsdp", 1) * mesh.get("expert", 1)
  if "data" in mesh:
    dp = mesh["data"] * mesh.get("fsdp", 1) * mesh.get("expert", 1)
  batch = int(config.plan.batch_size) or dp * micro
  seq_len = int(config.plan.seq_len) or int(config.sampling.max_len)
  from jaxcredit.train.config import teacher_source
  from jaxcredit.train.tables.methods import METHODS

  teacher = teacher_source(config)
  teacher_cfg = None
  if METHODS[config.credit.method].teacher is not None and teacher not in ("", "policy", "reference"):
    teacher_cfg = model_config_for(teacher, config)
    teacher_cfg = dataclasses.replace(teacher_cfg, param_dtype="")  # frozen: stored in its compute dtype
  rl = {
    "rollouts": batch,  # the plan's batch is the step's rollouts, sampled then trained on
    "cache_len": seq_len + int(config.sampling.prompt_bucket) + int(config.sampling.chunk_size),
    "teacher_cfg": teacher_cfg,
    "teacher_rules": sharding.resolve_rules(dict(config.teacher.sharding_rules)),
    "async_depth": int(config.rollout.async_depth),
  }
  from jaxcredit.train.tables.engines import ENGINES
  from jaxcredit.train.loop.update import loss_config_of
  from jaxcredit.trajectory import pad_length

  # The update as the trainer runs it: the method's loss terms and, where `train.pack_rollouts` packs rollouts of
  # this length, the packed layout with every slot of a row scored (an upper bound on K).
  packs = bool(config.train.pack_rollouts) and pad_length(seq_len, int(config.train.length_bucket)) <= int(
    config.train.pack_max_row_len
  )
  report = plan_step(
    cfg,
    topology=topology,
    mesh=mesh,
    batch_size=batch,
    seq_len=seq_len,
    num_micro_batches=micro,
    step_time_s=float(config.plan.step_time_s) or None,
    loss_cfg=loss_config_of(config),
    packed_slots=pad_length(seq_len, int(config.train.slot_bucket)) if packs else 0,
    behavior_weights=ENGINES[config.rollout.engine].external or config.rollout.async_depth > 0,
    rl=rl,
    memo_dir=os.path.join(str(config.compilation_cache_dir), "plans") if config.compilation_cache_dir else None,
  )
  print(format_report(report))
  return report
