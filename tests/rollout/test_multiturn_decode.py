"""The environment sees exactly the text the model produced (issue 35 case 3).

Actions used to be decoded with `skip_special_tokens=True`: for a tokenizer that marks `<tool_call>` special the
environment got the call without its tags (finish "no_answer", no tool call). Now every token is decoded except the
stop token that ended the turn (the end of turn is the template's, not the message's). A scripted sampler plays fixed
token ids through `run_rollouts`, so the test needs no model.
"""

import jax
import numpy as np
import pytest

from jaxcredit.envs import arithmetic as ar
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import action_text, run_rollouts
from jaxcredit.sampling import SamplingParams
from jaxcredit.sampling.sampler import SampleOutput
from tests.fixtures.tiny_chat import tiny_tokenizer

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
ANSWER = "<answer>5</answer>"
TAGS = {
  "tool_call": ("<tool_call>", "</tool_call>"),
  "think": ("<think>", "</think>"),
  "answer": ("<answer>", "</answer>"),
  "none": (),
}


class Scripted:
  """A sampler that emits the given token ids, one list per turn (one rollout)."""

  def __init__(self, turns, reasons):
    self.turns, self.reasons, self.k = list(turns), list(reasons), 0

  def generate(self, prompts, params, key, decode_text=None):
    assert len(prompts) == 1
    ids, reason = self.turns[self.k], self.reasons[self.k]
    self.k += 1
    return SampleOutput(tokens=[list(ids)], logprobs=[np.zeros(len(ids), np.float32)], finish_reasons=[reason])


def _task():
  return ar.ArithmeticTask(
    task_id="t", question="What is 2+3?", answer="5", source="basic_arithmetic", expression="2+3"
  )


def _run(tok, texts, stop=True, stop_id=None, max_turns=3):
  stop_id = tok.eos_id if stop_id is None else stop_id
  turns = [tok.encode(t) + ([stop_id] if stop else []) for t in texts]
  params = SamplingParams(max_new_tokens=64, stop_token_ids=(tok.eos_id, tok.pad_id))
  sampler = Scripted(turns, ["stop_token" if stop else "length"] * len(turns))
  env = ar.ArithmeticEnv(_task(), max_tool_calls=2)
  prompt = [{"role": "user", "content": "What is 2+3?"}]
  (res,) = run_rollouts(
    sampler,
    tok,
    ChatFormat.from_tokenizer(tok),
    [env],
    [prompt],
    params,
    jax.random.key(0),
    max_turns=max_turns,
    max_len=4096,
  )
  return res


def test_issue35_case3_special_tool_call_tags_reach_the_environment():
  tok = tiny_tokenizer(extra_special=TAGS["tool_call"])
  assert tok.encode(CALL)[0] == tok.token_id("<tool_call>")  # one special token
  res = _run(tok, [CALL, ANSWER])
  assert res.tool_calls == 1 and res.finish == "answer" and res.reward == 1.0, res.messages
  assert [m["content"] for m in res.messages[1:]] == [CALL, "<tool_response>5</tool_response>", ANSWER]


@pytest.mark.parametrize("special", TAGS)
@pytest.mark.parametrize("stop", ["eos", "pad", "length"])
def test_actions_are_decoded_verbatim_for_any_special_tags_and_stop(special, stop):
  """Whichever tags are special and however the turn stopped, the environment gets the message's text exactly; a
  call written inside a think block stays hidden (its tags survive decoding), and the stop token is not text."""
  tok = tiny_tokenizer(extra_special=TAGS[special])
  hidden = "<think>maybe " + CALL.replace("2+3", "9*9") + "</think>"
  texts = [hidden + CALL, "<|im_start|>x " + ANSWER]  # a control token in the middle of a message is kept too
  stop_id = tok.pad_id if stop == "pad" else tok.eos_id
  res = _run(tok, texts, stop=stop != "length", stop_id=stop_id)
  assert [m["content"] for m in res.messages[1::2]] == texts
  assert res.messages[2]["content"] == "<tool_response>5</tool_response>"
  assert res.tool_calls == 1 and res.reward == 1.0


def test_action_text_drops_only_a_final_stop_token():
  tok = tiny_tokenizer(extra_special=TAGS["tool_call"])
  ids = tok.encode(CALL)
  assert action_text(tok, ids + [tok.eos_id], (tok.eos_id,)) == CALL
  assert action_text(tok, ids + [tok.pad_id], (tok.eos_id, tok.pad_id)) == CALL
  assert action_text(tok, ids, (tok.eos_id,)) == CALL  # cut by length: nothing dropped
  assert action_text(tok, [tok.eos_id] + ids, (tok.eos_id,)) == "<|im_end|>" + CALL  # only the last token stops
  assert action_text(tok, [], (tok.eos_id,)) == ""
