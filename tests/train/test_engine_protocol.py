"""The rollout-engine protocol (`jaxcredit.sampling.engine.RolloutEngine`): the jax sampler and the vLLM engine
satisfy it, with the protocol's signatures, and `build_engine` refuses a row whose engine lacks a member, naming the
row and the member."""

import inspect
import types

import pytest
from flax import nnx

from jaxcredit.models import Decoder
from jaxcredit.sampling import Sampler
from jaxcredit.sampling.engine import ENGINE_MEMBERS, RolloutEngine, SessionEngine, missing_engine_members
from jaxcredit.sampling.vllm_engine import VLLMEngine
from jaxcredit.train import config as config_lib
from jaxcredit.train.tables.engines import ENGINES, Engine, build_engine
from tests.fixtures.tiny_model import tiny_decoder_config
from tests.fixtures.fake_vllm import FakeServer, make_engine


def _tiny_model():
  return Decoder(tiny_decoder_config(vocab_size=64), rngs=nnx.Rngs(0))


def test_the_protocol_members():
  assert ENGINE_MEMBERS == ("generate", "update_model", "release_weights", "close", "stats", "version")


@pytest.mark.parametrize("cls", [Sampler, VLLMEngine])
def test_engine_methods_take_the_protocol_arguments(cls):
  """Every method has the protocol's parameters, of the same kind and default (an engine may take more)."""
  for name in ENGINE_MEMBERS:
    protocol = vars(RolloutEngine).get(name)
    if not callable(protocol):
      continue
    theirs = inspect.signature(getattr(cls, name)).parameters
    for p in inspect.signature(protocol).parameters.values():
      assert p.name in theirs, f"{cls.__name__}.{name} lacks {p.name}"
      assert (theirs[p.name].kind, theirs[p.name].default) == (p.kind, p.default), f"{cls.__name__}.{name}({p.name})"


def test_the_jax_sampler_is_a_session_engine():
  c = config_lib.base_config()
  sampler = build_engine(c, _tiny_model(), types.SimpleNamespace(pad_id=0))
  assert isinstance(sampler, Sampler)
  assert isinstance(sampler, RolloutEngine) and isinstance(sampler, SessionEngine)
  assert missing_engine_members(sampler) == []


def test_the_vllm_engine_is_a_rollout_engine(tmp_path):
  server = FakeServer()
  try:
    engine = make_engine(server.url, tmp_path)
    assert isinstance(engine, RolloutEngine) and not isinstance(engine, SessionEngine)
    assert missing_engine_members(engine) == []
  finally:
    server.close()


class _NoRelease:
  """An engine without release_weights and with a `version` that is missing too."""

  def __init__(self):
    self.stats = {}
    self.closed = False

  def generate(self, prompts, params, key, *, decode_text=None):
    raise NotImplementedError

  def update_model(self, model, *, version=None, max_staleness=0):
    pass

  def close(self):
    self.closed = True


def test_an_engine_without_a_member_is_refused_naming_the_row_and_the_member(monkeypatch):
  built = []
  monkeypatch.setitem(ENGINES, "partial", Engine(lambda c, m, t: built.append(_NoRelease()) or built[-1], False))
  c = config_lib.base_config()
  c.rollout.engine = "partial"
  message = (
    r"rollout engine 'partial': ENGINES\['partial'\].build returned a _NoRelease without release_weights, version"
  )
  with pytest.raises(ValueError, match=message):
    build_engine(c, None, None)
  assert built[0].closed  # what the row started is stopped


def test_a_member_that_is_not_callable_counts_as_missing():
  engine = _NoRelease()
  engine.release_weights, engine.version = "not a method", None
  assert missing_engine_members(engine) == ["release_weights"]
  assert not isinstance(types.SimpleNamespace(), RolloutEngine)
