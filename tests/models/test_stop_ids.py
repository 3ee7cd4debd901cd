"""Issue 35 case 4: every end-of-sequence source reaches the sampler's stop ids: the tokenizer's eos token,
generation_config.json's eos_token_id (an int or a list), the GGUF's end-of-turn / end-of-message ids and the chat
template's end-of-turn token."""

import json
import types

import jax
import pytest

from jaxcredit.models import ChatTokenizer, load_model, load_tokenizer
from jaxcredit.sampling import Sampler, SamplingParams
from jaxcredit.train.loop import run as run_lib
from jaxcredit.train.config import base_config
from tests.fixtures.tiny_model import CFG, TOKENS, random_params, write_gguf

# The tiny vocabulary's control tokens: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> (the eos token).
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, 0]}


def _tokenizer_folder(tmp_path, generation_config=None, sub=""):
  tok = ChatTokenizer.from_gguf(write_gguf(tmp_path / "tiny.gguf", "llama", CFG, random_params(CFG)))
  folder = tmp_path / "model"
  tok.save_pretrained(folder / sub if sub else folder)
  if generation_config is not None:
    where = folder / "hf" if sub else folder
    where.mkdir(parents=True, exist_ok=True)
    (where / "generation_config.json").write_text(json.dumps(generation_config))
  return folder


def test_generation_config_eos_list_reaches_the_stop_ids(tmp_path):
  """eos_token_id [2, 0] in an HF folder's generation_config.json: the stop ids hold both (it stopped at 2 only)."""
  tok = load_tokenizer(_tokenizer_folder(tmp_path, GENERATION_CONFIG))
  assert tok.eos_id == 2 and tok.stop_ids == (2, 0)


def test_converted_checkpoint_reads_its_copy_of_generation_config(tmp_path):
  """A converted checkpoint keeps the source's generation_config.json under hf/ and its tokenizer under
  tokenizer/: both reach the stop ids."""
  tok = load_tokenizer(_tokenizer_folder(tmp_path, {"eos_token_id": 0}, sub="tokenizer"))
  assert tok.stop_ids == (2, 0)


@pytest.mark.parametrize(
  "value,named",
  [([2, "x"], "'x'"), (-1, "-1"), (300, "300"), ("2", "'2'"), ([2, True], "True")],
)
def test_bad_generation_config_eos_is_refused_naming_file_and_field(tmp_path, value, named):
  with pytest.raises(ValueError, match="generation_config.json") as info:
    load_tokenizer(_tokenizer_folder(tmp_path, {"eos_token_id": value}))
  assert "eos_token_id" in str(info.value) and named in str(info.value)


def test_gguf_end_of_turn_ids_and_the_template_end_of_turn_reach_the_stop_ids(tmp_path):
  """tokenizer.ggml.eot_token_id / eom_token_id (llama.cpp's Llama 3 <|eot_id|>, <|eom_id|>) and the token the chat
  template closes an assistant message with are stop ids, and survive save_pretrained."""

  def eot(w):
    w.add_uint32("tokenizer.ggml.eot_token_id", 0)

  path = write_gguf(tmp_path / "eot.gguf", "llama", CFG, random_params(CFG), extra=eot)
  tok = ChatTokenizer.from_gguf(path)
  assert tok.stop_ids == (2, 0)
  tok.save_pretrained(tmp_path / "saved")
  assert ChatTokenizer.from_pretrained(tmp_path / "saved").stop_ids == (2, 0)
  # A tokenizer whose eos token is <|endoftext|> but whose template ends a turn with <|im_end|>: both stop.
  other = ChatTokenizer(tok.tokenizer, tok.chat_template, eos_token="<|endoftext|>")
  assert other.stop_ids == (0, TOKENS.index("<|im_end|>"))


def test_the_trainer_samples_until_any_stop_id():
  c = base_config()
  run = types.SimpleNamespace(
    config=c, tok=types.SimpleNamespace(eos_id=2, stop_ids=(2, 0)), env=types.SimpleNamespace(stop_strings=())
  )
  assert run_lib.rollout_sampling_params(run).stop_token_ids == (2, 0)


def test_sampler_stops_at_the_second_eos_id(tmp_path):
  """The greedy continuation's first token, listed second in generation_config.json's eos_token_id, ends the
  row right after it (finish reason stop_token)."""
  path = write_gguf(tmp_path / "tiny.gguf", "llama", CFG, random_params(CFG, seed=5))
  model, _ = load_model(path, cache_dir=tmp_path / "cache")
  tok = ChatTokenizer.from_gguf(path)
  sampler = Sampler(model, max_len=32, pad_id=tok.pad_id, chunk_size=8, prompt_bucket=8)
  prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True))
  greedy = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=8)
  free = sampler.generate([prompt], greedy, jax.random.key(0))
  first = free.tokens[0][0]
  assert first != tok.eos_id and first < tok.vocab_size and len(free.tokens[0]) == 8
  tok.save_pretrained(tmp_path / "folder")
  (tmp_path / "folder" / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_id, first]}))
  stop_ids = load_tokenizer(tmp_path / "folder").stop_ids
  assert stop_ids == (tok.eos_id, first)
  out = sampler.generate(
    [prompt], SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=8, stop_token_ids=stop_ids), jax.random.key(0)
  )
  assert out.tokens[0] == [first] and out.finish_reasons[0] == "stop_token"


def test_a_gguf_tokenizer_cache_written_without_stop_ids_is_rebuilt(tmp_path):
  """The conversion cache of a GGUF whose eot id the old cache did not keep: load_tokenizer rebuilds it."""
  from jaxcredit.models import converted_cache_dir

  def eot(w):
    w.add_uint32("tokenizer.ggml.eot_token_id", 0)

  path = write_gguf(tmp_path / "eot.gguf", "llama", CFG, random_params(CFG), extra=eot)
  cache = tmp_path / "cache"
  assert load_tokenizer(path, cache_dir=cache).stop_ids == (2, 0)
  config_file = converted_cache_dir(path, cache) / "tokenizer" / "tokenizer_config.json"
  old = json.loads(config_file.read_text())
  del old["stop_token_ids"]  # as written before this change
  config_file.write_text(json.dumps(old))
  assert load_tokenizer(path, cache_dir=cache).stop_ids == (2, 0)
  assert json.loads(config_file.read_text())["stop_token_ids"] == [0]
