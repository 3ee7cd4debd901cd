"""`python -m tests.multidevice.mesh_load HF_FOLDER CACHE_DIR` on 4 CPU devices: loading onto a mesh restores each
parameter into its shards, and the sharded model's logits equal the single-device ones. Prints ok. Run by
tests/models/test_hf_roundtrip.py through tests/fixtures/multidevice.py."""

import sys
import jax, numpy as np
from flax import nnx
from jaxcredit.models import load
from jaxcredit.models.decoder import param_logical_axes
from jaxcredit.sharding import make_mesh, param_shardings

assert jax.device_count() == 4, jax.devices()
folder, cache = sys.argv[1], sys.argv[2]
tokens = np.random.default_rng(0).integers(0, 96, size=(2, 16)).astype(np.int32)
forward = nnx.jit(lambda model, t: model(t)[0])
single, cfg = load(folder, cache_dir=cache)
expected_logits = np.asarray(forward(single, tokens))
for shape in ({"expert": 2, "tensor": 2}, {"fsdp": 2, "tensor": 2}):
  mesh = make_mesh(shape)
  model, cfg = load(folder, cache_dir=cache, mesh=mesh)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  expected = param_shardings(
    jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params), mesh, param_logical_axes(cfg)
  )
  sharded = 0
  for (path, x), s in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(expected)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)
    sharded += not x.sharding.is_fully_replicated
  assert sharded >= 8, sharded
  np.testing.assert_allclose(np.asarray(forward(model, tokens)), expected_logits, atol=1e-5)
print("ok")
