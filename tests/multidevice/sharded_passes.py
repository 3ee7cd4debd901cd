"""On 8 CPU devices (fsdp=8, and fsdp=4 x tensor=2) the teacher pass and TRACE's packed gold scoring equal the
1-device results. Prints PASSES-SHARDED-OK. Run by tests/train/test_sharded_passes.py through
tests/fixtures/multidevice.py."""

import jax, numpy as np
from flax import nnx
from jaxcredit import sharding
from jaxcredit.models.decoder import Decoder, param_logical_axes
from jaxcredit.scoring import teacher as tp
from jaxcredit.scoring.gold import score_gold_answers_packed
from jaxcredit.train.loop import step as step_lib
from jaxcredit.trajectory import RolloutBuilder, pack

from tests.fixtures.tiny_model import tiny_decoder_config

assert jax.device_count() == 8
cfg = tiny_decoder_config(tie_word_embeddings=False)
graphdef, params, rest = step_lib.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))
rng = np.random.default_rng(0)
builders = []
for i in range(4):
  b = RolloutBuilder.from_prompt(rng.integers(3, 64, size=5 + i).tolist())
  b.append_action(rng.integers(3, 64, size=4).tolist())
  b.append_context(rng.integers(3, 64, size=3).tolist())
  b.mark_boundary()
  b.append_action(rng.integers(3, 64, size=2 + i).tolist())
  builders.append(b)
traj = pack(builders, [1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], max_turns=3, pad_id=0, length_bucket=16)
prompts = [rng.integers(3, 64, size=int(n) + 3).tolist() for n in traj.prompt_len_B]
batch = tp.build_teacher_batch(traj, prompts, max_len=64, pad_id=0, length_bucket=16)
run = tp.make_teacher_pass_fn(graphdef, rest, 0.8, student_graphdef=graphdef, student_rest=rest)
gold_fn = step_lib.make_packed_gold_fn(graphdef, rest)
gold_ids = [[7, 8, 9, 2]] * 4


def passes(mesh_shape):
  mesh = sharding.make_mesh(mesh_shape, jax.devices() if mesh_shape else jax.devices()[:1])
  p = jax.device_put(params, sharding.param_shardings(params, mesh, param_logical_axes(cfg)))
  with jax.set_mesh(mesh):
    r = run(p, batch, traj, p)
    gold, mask = score_gold_answers_packed(
      lambda *a: np.asarray(gold_fn(p, *a)), traj, gold_ids, pad_id=0, length_bucket=16
    )
  specs = {str(s.sharding.spec) for s in jax.tree_util.tree_leaves(p)}
  return r, gold, mask, specs


r1, g1, m1, _ = passes({})
assert r1.valid_B.all() and np.abs(r1.logp_BxL).max() > 0 and m1[:, :2].all()
for shape in ({"fsdp": 8}, {"fsdp": 4, "tensor": 2}):
  r8, g8, m8, specs = passes(shape)
  assert any("fsdp" in s for s in specs), specs
  for name in ("logp_BxL", "entropy_BxL", "divergence_BxL"):
    np.testing.assert_allclose(getattr(r8, name), getattr(r1, name), atol=2e-5, err_msg=f"{name} {shape}")
  np.testing.assert_array_equal(m8, m1)
  np.testing.assert_allclose(g8, g1, atol=1e-4, err_msg=f"gold {shape}")
  print("ok", shape)
print("PASSES-SHARDED-OK")
