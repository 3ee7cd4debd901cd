"""The vLLM rollout engine against a fake OpenAI-compatible server (fast): requests, parsing, seeds, weight syncs,
staleness, errors, a server that dies while starting. `tests/engines/test_vllm_server.py` runs a real
vLLM server."""

import sys

import jax
import numpy as np
import pytest

from jaxcredit.models import hf
from jaxcredit.sampling import SamplingParams
from jaxcredit.sampling.vllm_engine import EngineError, VLLMEngine, free_port, launch_server, served_models
from tests.fixtures.fake_vllm import CFG, FakeServer, make_engine, random_params


@pytest.fixture
def fake():
  server = FakeServer()
  yield server
  server.close()


def test_generate_sends_token_ids_with_a_seed_per_row_and_parses_ids_and_logprobs(fake, tmp_path):
  engine = make_engine(fake.url, tmp_path)
  params = SamplingParams(temperature=0.7, max_new_tokens=5, stop_token_ids=(2,), stop_strings=("</a>",))
  out = engine.generate([[5, 6, 7], [5, 6, 7], [9]], params, jax.random.key(3))
  bodies = fake.paths("/v1/completions")
  assert sorted(b["prompt"] for b in bodies) == [[5, 6, 7], [5, 6, 7], [9]]  # sent concurrently: any order
  assert len({b["seed"] for b in bodies}) == 3  # the rows of a group draw differently
  for b in bodies:
    assert b["temperature"] == 0.7 and b["top_p"] == 1.0 and b["max_tokens"] == 5
    assert b["stop_token_ids"] == [2] and b["stop"] == ["</a>"] and b["return_tokens_as_token_ids"]
    assert b["logprobs"] == 0 and b["include_stop_str_in_output"]
  # Output rows are in prompt order: row i holds its own prompt's length as its second token.
  assert [t[1] for t in out.tokens] == [3, 3, 1]
  assert all(t[2] == 2 for t in out.tokens)
  np.testing.assert_allclose(out.logprobs[0], [-0.5, -1.5, -0.25])
  assert out.finish_reasons == ["stop_token"] * 3
  assert engine.stats["rows"] == 3 and engine.stats["decode_tokens"] == 9
  again = engine.generate([[5, 6, 7], [5, 6, 7], [9]], params, jax.random.key(3))
  assert again.tokens == out.tokens  # the seeds come from the key


def test_greedy_is_temperature_zero_and_top_p_below_one_is_refused(fake, tmp_path):
  engine = make_engine(fake.url, tmp_path)
  engine.generate([[1]], SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=3), jax.random.key(0))
  assert fake.paths("/v1/completions")[-1]["temperature"] == 0.0
  with pytest.raises(ValueError, match="top_p=0.9"):
    engine.generate([[1]], SamplingParams(top_p=0.9), jax.random.key(0))


@pytest.mark.parametrize(
  "finish, stop_reason, expected",
  [("length", None, "length"), ("stop", "</a>", "stop_string"), ("stop", 2, "stop_token")],
)
def test_finish_reasons(tmp_path, finish, stop_reason, expected):
  server = FakeServer(finish=finish, stop_reason=stop_reason)
  try:
    out = make_engine(server.url, tmp_path).generate(
      [[1]], SamplingParams(max_new_tokens=3, stop_token_ids=(2,)), jax.random.key(0)
    )
    assert out.finish_reasons == [expected]
  finally:
    server.close()


def test_update_model_writes_weights_reloads_resets_the_prefix_cache_and_honours_staleness(fake, tmp_path):
  params = random_params()
  engine = make_engine(fake.url, tmp_path, params)
  engine.update_model(object(), version=4)
  rpc = fake.paths("/collective_rpc")
  assert rpc == [{"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "weights" / "v4")}}]
  assert len(fake.paths("/reset_prefix_cache")) == 1
  assert engine.version == 4 and engine.stats["syncs"] == 1 and len(engine.sync_seconds) == 1
  # The shards hold the parameters in the HF layout.
  back = dict(hf.iter_hf_tensors(tmp_path / "weights" / "v4"))
  assert CFG.tie_word_embeddings  # written untied: the output head as its own tensor, a copy of the embedding
  np.testing.assert_array_equal(back.pop("lm_head.weight"), params["embedding"])
  slots = {s.hf_name: s for s in hf.hf_slots(CFG)}
  for name, array in back.items():
    slot = slots[name]
    np.testing.assert_array_equal(
      slot.to_ours(array, params[slot.param][slot.index].shape), params[slot.param][slot.index]
    )
  assert len(back) == len(slots)
  engine.update_model(object(), version=4)  # the server holds it already
  engine.update_model(object(), version=5, max_staleness=1)  # one version behind is allowed
  assert engine.stats["syncs"] == 1 and engine.version == 4
  engine.update_model(object(), version=6, max_staleness=1)  # two behind is not
  assert engine.stats["syncs"] == 2 and engine.version == 6
  assert not (tmp_path / "weights" / "v4").exists()  # the previous version's folder is removed
  engine.update_model(object())  # no version: always
  assert engine.stats["syncs"] == 3 and engine.version is None


def test_unreachable_server_and_wrong_model_are_refused_in_one_line(fake, tmp_path):
  url = f"http://127.0.0.1:{free_port()}"
  with pytest.raises(EngineError, match=f"no OpenAI-compatible server answers at {url}") as e:
    served_models(url)
  assert "\n" not in str(e.value)
  with pytest.raises(EngineError, match="serves \\['policy'\\], not config.rollout.vllm.served_model_name='other'"):
    VLLMEngine(fake.url, "other", CFG, tmp_path, lambda m: {})


def test_a_server_that_exits_while_starting_is_reported_with_its_log(tmp_path):
  # This Python has no vllm: the server exits at once, and the error carries the end of its log.
  with pytest.raises(EngineError, match="exited with code 1 while starting(.|\n)*No module named 'vllm"):
    launch_server(
      sys.executable,
      tmp_path,
      served_model_name="policy",
      dtype="float32",
      max_model_len=64,
      log_path=tmp_path / "server.log",
      startup_timeout_s=60,
    )
  with pytest.raises(FileNotFoundError, match="rollout.vllm.python='/no/such/python'"):
    launch_server(
      "/no/such/python", tmp_path, served_model_name="p", dtype="float32", max_model_len=8, log_path=tmp_path / "l"
    )


def test_save_hf_weights_refuses_missing_and_misshapen_parameters(tmp_path):
  params = random_params()
  with pytest.raises(ValueError, match="'final_norm' is missing"):
    hf.save_hf_weights(CFG, {k: v for k, v in params.items() if k != "final_norm"}, tmp_path)
  with pytest.raises(ValueError, match="'embedding' has shape \\(3,\\)"):
    hf.save_hf_weights(CFG, {**params, "embedding": np.zeros(3, np.float32)}, tmp_path)


def test_a_null_logprob_is_read_as_nan_not_minus_infinity(tmp_path):
  """Issue 35 case 11: vLLM returned a token without a log-prob (null); the adapter read it as -inf, which made the
  trainer's log-ratio +inf and gave the token the largest importance weight. It is NaN now: no log-prob, which
  the trainer takes out of the loss (`jaxcredit.trajectory.drop_invalid_behavior_logp`)."""
  server = FakeServer(logprobs=(-0.5, None, -0.25))
  try:
    out = make_engine(server.url, tmp_path).generate([[1]], SamplingParams(max_new_tokens=3), jax.random.key(0))
    assert np.isnan(out.logprobs[0][1]) and out.logprobs[0].dtype == np.float32
    np.testing.assert_array_equal(out.logprobs[0][[0, 2]], np.float32([-0.5, -0.25]))
  finally:
    server.close()


@pytest.mark.parametrize(
  "sentinel",
  [-9999.0, -1e30, "-Infinity", "x", True],
  ids=["vllm-clamp", "below-clamp", "string-inf", "string", "bool"],
)
def test_every_missing_logprob_encoding_is_nan(sentinel, tmp_path):
  """Issue 54 case 8: vLLM's completions API writes a -inf log-prob as -9999.0 (its clamp); read as a real value the
  token got the cap weight and engine_logp_gap_max read 9996. Every encoding of "no log-prob" the server may send
  (its clamp or below, a non-finite or non-numeric value) reads as NaN; a real log-prob, however small, is kept."""
  server = FakeServer(logprobs=(-0.5, sentinel, -9998.5))
  try:
    out = make_engine(server.url, tmp_path).generate([[1]], SamplingParams(max_new_tokens=3), jax.random.key(0))
    assert np.isnan(out.logprobs[0][1])
    np.testing.assert_array_equal(out.logprobs[0][[0, 2]], np.float32([-0.5, -9998.5]))
  finally:
    server.close()
