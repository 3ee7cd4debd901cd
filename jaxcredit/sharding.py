"""The one place for sharding rules: the mesh, and the table from logical axes to mesh axes.

Mesh axes (MaxText's names): data (pure data parallel), fsdp (data parallel with parameters and optimizer state
sharded), expert (expert parallel: the experts of a MoE layer; batch otherwise), tensor (tensor parallel: heads,
MLP width, vocabulary).

Every parameter and the main activations carry logical axis names (`jaxcredit.models.decoder.param_logical_axes`,
`constrain` calls in the decoder); `RULES` maps each logical name to mesh axes. A mesh axis whose size does not
divide the dimension is dropped for that array (it is replicated over that axis instead), and a mesh axis is
used at most once per array. Override rules with `config.sharding_rules` (a dict name -> axis, tuple or None).

The table in force is a value, not a module global: `use_rules(table)` makes it active for the code (and the
traces) inside its `with` block, in this thread and context only; outside any block the defaults apply. So a
policy and a teacher may each carry their own table (`config.teacher.sharding_rules`), and functions that take a
`rules=` argument (`logical_to_spec`, `param_shardings`, `batch_sharding`, `shard_batch`) need no context at all.

    logical name        mesh axes                   used by
    batch               (data, fsdp, expert)        leading axis of every batch array
    activation_batch    (data, fsdp, expert)        activations' batch axis
    activation_length   None                        sequence axis
    activation_embed    None                        residual stream width
    activation_heads    tensor                      attention heads of activations
    activation_kv_heads tensor
    activation_mlp      tensor                      MLP width of activations
    activation_expert   expert                      expert axis of dense-MoE activations
    activation_vocab    tensor                      logits' vocabulary axis
    layers              None                        the stacked-layer axis of scanned parameters
    embed               fsdp                        D of every weight matrix
    vocab               tensor                      V of the embedding and the head
    q_heads, kv_heads   tensor                      H, K of the attention projections
    head_dim            None
    mlp                 tensor                      F (and Fm) of the MLPs
    expert              expert                      E of the expert weights
    router_experts      None                        E of the router (small)
    norm                None                        norm weights
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")

RULES: dict[str, Any] = {
  "batch": BATCH_AXES,
  "activation_batch": BATCH_AXES,
  "activation_length": None,
  "activation_embed": None,
  "activation_heads": "tensor",
  "activation_kv_heads": "tensor",
  "activation_mlp": "tensor",
  "activation_expert": "expert",
  "activation_vocab": "tensor",
  "layers": None,
  "embed": "fsdp",
  "vocab": "tensor",
  "q_heads": "tensor",
  "kv_heads": "tensor",
  "head_dim": None,
  "mlp": "tensor",
  "expert": "expert",
  "router_experts": None,
  "norm": None,
}

_rules_in_force: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
  "jaxcredit_sharding_rules", default=None
)


def active_rules() -> dict[str, Any]:
  """The table in force: the innermost `use_rules` block's, else RULES."""
  rules = _rules_in_force.get()
  return dict(RULES) if rules is None else rules


@contextlib.contextmanager
def use_rules(rules: Mapping[str, Any] | None):
  """Makes a table the one in force inside the block (traces included: a jitted function traced inside it
  constrains its activations by this table). `rules` is a resolved table or overrides of RULES (None: RULES).

  jit caches a trace by function and argument types, not by table: a function already traced under one table
  keeps it. Give each table its own function (a closure per model, as the trainer's passes and samplers are).

  Raises:
    ValueError: for an unknown logical name or mesh axis (see `resolve_rules`).
  """
  token = _rules_in_force.set(resolve_rules(rules))
  try:
    yield active_rules()
  finally:
    _rules_in_force.reset(token)


def make_mesh(shape: Mapping[str, int], devices=None) -> Mesh:
  """Builds a Mesh over `devices` (default: all) with axes MESH_AXES (Auto axis types).

  Args:
    shape: sizes per axis name, e.g. {"data": 1, "fsdp": 8}; missing axes have size 1. One axis may be -1: it takes
      the devices the others leave.

  Raises:
    ValueError: an unknown axis, more than one -1, or sizes whose product exceeds the device count.
  """
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"config.mesh has unknown axes {sorted(unknown)}; known: {MESH_AXES}")
  devices = list(jax.devices() if devices is None else devices)
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if -1 in sizes:
    rest = math.prod(s for s in sizes if s != -1)
    if len(devices) % rest:
      raise ValueError(f"config.mesh: {len(devices)} devices are not divisible by {rest}")
    sizes[sizes.index(-1)] = len(devices) // rest
  if any(s < 1 for s in sizes):
    raise ValueError(f"config.mesh sizes must be >= 1 (or one -1), got {dict(zip(MESH_AXES, sizes))}")
  n = math.prod(sizes)
  if n > len(devices):
    raise ValueError(f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {n} devices, {len(devices)} available")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices[:n])


def rules_to_config(rules: Mapping[str, Any] = RULES) -> dict[str, str]:
  """The table as config strings: "" for None, "a,b" for a tuple (so `--config.sharding_rules.mlp=` works)."""
  return {name: ",".join(_as_tuple(axes)) for name, axes in rules.items()}


def resolve_rules(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
  """RULES updated with `overrides` (values: None, a mesh axis, a tuple/list of them, or a config string "" /
  "axis" / "a,b"), checked.

  Raises:
    ValueError: an unknown logical name or a mesh axis not in MESH_AXES, naming the key.
  """
  rules = dict(RULES)
  for name, axes in dict(overrides or {}).items():
    if name not in RULES:
      raise ValueError(f"config.sharding_rules: unknown logical axis {name!r}; known: {sorted(RULES)}")
    if isinstance(axes, str):
      axes = tuple(a.strip() for a in axes.split(",") if a.strip())
    axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
    for axis in _as_tuple(axes):
      if axis not in MESH_AXES:
        raise ValueError(f"config.sharding_rules.{name}: unknown mesh axis {axis!r}; known: {MESH_AXES}")
    if isinstance(axes, tuple):
      axes = None if not axes else axes[0] if len(axes) == 1 else axes
    rules[name] = axes
  return rules


def _as_tuple(axes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return tuple(axes) if isinstance(axes, (list, tuple)) else (axes,)


def logical_to_spec(
  logical: Sequence[str | None],
  shape: Sequence[int],
  mesh_shape: Mapping[str, int],
  rules: Mapping[str, Any] | None = None,
) -> P:
  """The PartitionSpec of an array with these logical axes and this shape.

  Each dimension takes the mesh axes its logical name maps to, keeping only axes of size > 1 that are not used by
  an earlier dimension and whose product still divides the dimension.
  """
  rules = active_rules() if rules is None else rules
  if len(logical) != len(shape):
    raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
  used: set[str] = set()
  spec = []
  for name, dim in zip(logical, shape):
    if name is not None and name not in rules:
      raise ValueError(f"unknown logical axis {name!r}; known: {sorted(rules)}")
    chosen: list[str] = []
    for axis in _as_tuple(rules.get(name) if name is not None else None):
      size = mesh_shape.get(axis, 1)
      if size <= 1 or axis in used:
        continue
      if dim % (math.prod(mesh_shape[a] for a in chosen) * size) == 0:
        chosen.append(axis)
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  while spec and spec[-1] is None:
    spec.pop()
  return P(*spec)


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
  """`with_sharding_constraint` by logical axes under the context mesh (`jax.set_mesh`); a no-op without one."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return x
  spec = logical_to_spec(logical, x.shape, dict(mesh.shape))
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def batch_sharding(mesh: Mesh, ndim: int, rules: Mapping[str, Any] | None = None) -> NamedSharding:
  """Leading axis over the batch axes (the table's `batch` entry; default: the table in force), the rest
  replicated."""
  return NamedSharding(mesh, P(_batch_axes(mesh, rules), *([None] * (ndim - 1))))


def _batch_axes(mesh: Mesh, rules: Mapping[str, Any] | None = None) -> tuple[str, ...]:
  rules = active_rules() if rules is None else rules
  return tuple(a for a in _as_tuple(rules["batch"]) if a in mesh.shape)


def data_parallel_size(mesh: Mesh, rules: Mapping[str, Any] | None = None) -> int:
  """How many ways the batch axis is split (the product of the mesh axes the table's `batch` entry names)."""
  return math.prod(mesh.shape[a] for a in _batch_axes(mesh, rules))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def param_shardings(
  params,
  mesh: Mesh,
  logical_axes: Mapping[str, tuple] | Callable[[str, int], tuple],
  rules: Mapping[str, Any] | None = None,
):
  """NamedShardings for a parameter pytree (an nnx.State or nested dict of the decoder's parameters, or an optimizer
  state, whose leaf paths nest parameter paths).

  Args:
    params: the pytree; leaf paths end with a parameter path such as layers/wq.
    mesh: the mesh.
    logical_axes: parameter path -> logical axes, as a table (`jaxcredit.models.decoder.param_logical_axes(cfg)`:
      a leaf takes the entry of the longest path its own path ends with; a scalar no entry names, such as an
      optimizer's step count, is replicated) or as a function (path, rank) -> logical axes
      (`jaxcredit.models.decoder.default_logical_axes`).
    rules: the logical -> mesh axes table (default: the table in force, `use_rules`).

  Raises:
    ValueError: a non-scalar leaf whose path the table does not name (or the function's own error).
  """
  mesh_shape = dict(mesh.shape)

  def from_table(keys: list[str], ndim: int) -> tuple:
    for n in range(len(keys)):
      logical = logical_axes.get("/".join(keys[n:]))
      if logical is not None:
        return logical
    if ndim == 0:
      return ()
    raise ValueError(f"no logical axes for parameter {'/'.join(keys)!r}; the table names {sorted(logical_axes)}")

  def one(path, x):
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    keys = [k for k in keys if k != "value"]
    if callable(logical_axes):
      logical = logical_axes("/".join(keys), np.ndim(x))
    else:
      logical = from_table(keys, np.ndim(x))
    return NamedSharding(mesh, logical_to_spec(logical, np.shape(x), mesh_shape, rules))

  return jax.tree_util.tree_map_with_path(one, params)


def shard_batch(batch, mesh: Mesh, rules: Mapping[str, Any] | None = None):
  """Places every array of a batch pytree with its leading axis over the batch axes (of `rules`; default: the table
  in force).

  Raises:
    ValueError: if a leading axis is not divisible by the data-parallel size.
  """
  dp = data_parallel_size(mesh, rules)

  def put(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.device_put(x, replicated(mesh))
    if x.shape[0] % dp:
      raise ValueError(
        f"batch axis {x.shape[0]} is not divisible by the data-parallel size {dp} "
        f"(config.mesh data*fsdp*expert); change the number of rollouts per step"
      )
    return jax.device_put(x, batch_sharding(mesh, x.ndim, rules))

  return jax.tree_util.tree_map(put, batch)
