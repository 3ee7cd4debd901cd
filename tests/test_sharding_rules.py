"""The sharding table is a value in force inside `use_rules` blocks (a context variable), not a module global: a
policy and a teacher can each carry their own."""

import threading

import pytest
from jax.sharding import PartitionSpec as P

from jaxcredit import sharding
from jaxcredit.train import config as config_lib
from jaxcredit.train.tables import passes as passes_lib

from tests.fixtures.multidevice import run_on_devices

MESH = {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}


def test_defaults_outside_any_block_and_overrides_inside():
  assert sharding.active_rules() == sharding.RULES
  w = ("embed", "mlp")
  assert sharding.logical_to_spec(w, (64, 128), MESH) == P("fsdp", "tensor")
  with sharding.use_rules({"embed": None, "mlp": "fsdp,tensor"}) as rules:
    assert rules["mlp"] == ("fsdp", "tensor") and sharding.active_rules() is not sharding.RULES
    assert sharding.logical_to_spec(w, (64, 128), MESH) == P(None, ("fsdp", "tensor"))
    with sharding.use_rules(None):  # nested: the defaults again
      assert sharding.logical_to_spec(w, (64, 128), MESH) == P("fsdp", "tensor")
    assert sharding.logical_to_spec(w, (64, 128), MESH) == P(None, ("fsdp", "tensor"))
  assert sharding.active_rules() == sharding.RULES


def test_an_error_inside_the_block_restores_the_table():
  with pytest.raises(RuntimeError):
    with sharding.use_rules({"mlp": None}):
      raise RuntimeError
  assert sharding.active_rules()["mlp"] == "tensor"


def test_explicit_rules_need_no_block():
  rules = sharding.resolve_rules({"embed": "tensor"})
  assert sharding.logical_to_spec(("embed", "mlp"), (64, 128), MESH, rules) == P("tensor")
  assert sharding.logical_to_spec(("embed", "mlp"), (64, 128), MESH) == P("fsdp", "tensor")


def test_another_thread_keeps_its_own_table():
  seen = {}
  entered, release = threading.Event(), threading.Event()

  def other():
    entered.wait(10)
    seen["other"] = sharding.active_rules()["mlp"]
    release.set()

  t = threading.Thread(target=other)
  t.start()
  with sharding.use_rules({"mlp": None}):
    entered.set()
    release.wait(10)
    seen["main"] = sharding.active_rules()["mlp"]
  t.join()
  assert seen == {"other": "tensor", "main": None}


def test_a_model_carries_its_table_into_its_pass():
  """PassFns runs a model's jitted pass with the model's own table in force (what a teacher checkpoint uses)."""
  import jax

  fns = passes_lib.PassFns(sharding.make_mesh({}, jax.devices()[:1]), 1.0)
  teacher_rules = sharding.resolve_rules({"mlp": None})
  call = fns._under_mesh(lambda: sharding.active_rules()["mlp"], teacher_rules)
  assert call() is None
  assert fns._under_mesh(lambda: sharding.active_rules()["mlp"])() == "tensor"


def test_a_bad_teacher_table_names_its_key():
  c = config_lib.base_config()
  c.teacher.sharding_rules.mlp = "tensr"
  with pytest.raises(ValueError, match=r"config\.teacher\.sharding_rules\.mlp: unknown mesh axis 'tensr'"):
    config_lib.validate(c)


def test_a_trace_constrains_activations_by_the_table_in_force():
  """On 8 CPU devices: a function traced under each of two tables gets two output shardings. (jit caches traces by
  function, not by table: each table gets its own closure, as each model's passes do.)"""
  assert "RULES-OK" in run_on_devices("rules_trace.py", timeout=300)
