"""On 8 CPU devices: a function traced under each of two sharding tables gets two output shardings. Prints RULES-OK.
Run by tests/test_sharding_rules.py through tests/fixtures/multidevice.py."""

import jax, jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxcredit import sharding

mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})


def make_f():
  def f(x):
    return sharding.constrain(x * 2, ("activation_batch", "activation_mlp"))

  return f


x = jnp.ones((8, 16))
specs = []
for rules in (None, {"activation_mlp": None, "activation_batch": "fsdp,tensor"}):
  f = make_f()
  with jax.set_mesh(mesh), sharding.use_rules(rules):
    specs.append(jax.jit(f).lower(x).compile().output_shardings.spec)
print(specs)
assert specs[0] == P("fsdp", "tensor"), specs
assert specs[1] == P(("fsdp", "tensor")), specs
print("RULES-OK")
