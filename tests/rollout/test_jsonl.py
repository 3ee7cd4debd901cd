"""Rollouts as JSONL: lossless export/import, packing in any order, tool_calls extraction, error messages."""

import json
import os
import re
import tempfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit.envs import tool_calls as tc
from jaxcredit.rollout import jsonl
from jaxcredit.rollout.multiturn import RolloutResult
from jaxcredit.trajectory import RolloutBuilder, pack


def canon(x):
  """A structure where floats compare by their bits (so -0.0 != 0.0 and 1 != 1.0)."""
  if isinstance(x, float):
    return ("float", x.hex())
  if isinstance(x, bool):
    return ("bool", x)
  if isinstance(x, int):
    return ("int", x)
  if isinstance(x, dict):
    return ("dict", [(k, canon(v)) for k, v in x.items()])
  if isinstance(x, list):
    return ("list", [canon(v) for v in x])
  return (type(x).__name__, x)


def joined(s):
  """`s` with each surrogate pair written as two code points joined into its character (what JSON reads back)."""
  return s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def roundtrip_file(records):
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "rollouts.jsonl")
    jsonl.write_jsonl(path, records)
    with open(path, "rb") as f:
      raw = f.read()
    return jsonl.read_jsonl(path), raw


def small_builder():
  """prompt [5 6 7] | turn 0 [8 9] | obs [10] (boundary) | unit 1 | turn 1 [11]."""
  b = RolloutBuilder.from_prompt([5, 6, 7])
  b.append_action([8, 9], [-0.5, -0.25])
  b.append_context([10])
  b.mark_boundary()
  b.next_unit()
  b.append_action([11], [-1.0])
  return b


def small_record(**kw):
  args = dict(rollout_id="r0", group_id="g", reward=1.0, unit_rewards=[0.5, 1.0])
  args.update(kw)
  return jsonl.rollout_to_record(small_builder(), **args)


# --------------------------------------------------------------------------------------------------- strategies

SPECIALS = [
  "<|im_start|>assistant\n",
  "<|im_end|>",
  "<|endoftext|>",
  "\x00",
  "\x1b[0m",
  "\u2028",
  "\u2029",
  "\x85",
  "\r\n",
  "\r",
  "\t",
  "\ud800",
  "\udfff",
  "😀",
  "naïve",
  "中文",
  "</tool_call>",
  "<think>",
  "\\",
  '"',
  "\ufeff",
]
texts = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(SPECIALS)), max_size=6).map("".join)
token = st.one_of(st.integers(0, 300), st.integers(0, 2**31 - 1))
logp = st.one_of(
  st.floats(allow_nan=False, allow_infinity=False),
  st.floats(width=32, allow_nan=False, allow_infinity=False),
  st.just(-0.0),
)
finite = st.floats(allow_nan=False, allow_infinity=False)
logp32 = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), st.floats(-1e30, 1e30))


@st.composite
def builders(draw, logp=logp):
  b = RolloutBuilder.from_prompt(draw(st.lists(token, min_size=1, max_size=5)))
  for op in draw(st.lists(st.sampled_from(["action", "context", "boundary", "unit"]), max_size=10)):
    if op == "action":
      ids = draw(st.lists(token, max_size=4))  # an empty action still counts as a turn
      b.append_action(ids, draw(st.lists(logp, min_size=len(ids), max_size=len(ids))))
    elif op == "context":
      b.append_context(draw(st.lists(token, max_size=4)))
    elif op == "boundary":
      b.mark_boundary()
    else:
      b.next_unit()
  return b


@st.composite
def chats(draw):
  msgs = [{"role": "system", "content": draw(texts)}, {"role": "user", "content": draw(texts)}]
  for _ in range(draw(st.integers(0, 3))):
    content = draw(texts)
    if draw(st.booleans()):
      content += tc.render_tool_call(draw(texts) or "f", {draw(texts): draw(texts), "n": draw(finite)})
    msgs.append({"role": "assistant", "content": content})
    msgs.append({"role": "tool", "content": tc.render_tool_response(draw(texts))})
  return msgs


# --------------------------------------------------------------------------------------------------- round trips


def test_record_layout_exact():
  rec = small_record(
    task_id="t1",
    finish="answer",
    metadata={"k": np.float32(0.5), "arr": np.arange(2)},
    tools=[{"type": "function", "function": {"name": "f"}}],
  )
  assert rec == {
    "rollout_id": "r0",
    "group_id": "g",
    "task_id": "t1",
    "messages": [],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "token_ids": [5, 6, 7, 8, 9, 10, 11],
    "action_mask": [0, 0, 0, 1, 1, 0, 1],
    "turn_ids": [-1, -1, -1, 0, 0, -1, 1],
    "unit_ids": [-1, -1, -1, 0, 0, -1, 1],
    "behavior_logprobs": [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -1.0],
    "boundaries": [3, 6],
    "prompt_len": 3,
    "num_turns": 2,
    "current_unit": 1,
    "reward": 1.0,
    "unit_rewards": [0.5, 1.0],
    "finish": "answer",
    "metadata": {"k": 0.5, "arr": [0, 1]},
  }
  assert [type(x) for x in rec["action_mask"]] == [int] * 7
  assert type(rec["reward"]) is float
  assert "tools" not in small_record()


@given(b=builders(), data=st.data())
def test_builder_record_file_builder_is_lossless(b, data):
  unit_rewards = data.draw(st.lists(finite, min_size=b.unit + 1, max_size=b.unit + 3))
  messages = data.draw(chats())
  group_id = data.draw(st.one_of(st.integers(-5, 5), texts))
  rec = jsonl.rollout_to_record(
    b,
    rollout_id=data.draw(texts),
    group_id=group_id,
    reward=data.draw(finite),
    unit_rewards=unit_rewards,
    messages=messages,
    task_id=data.draw(texts),
    finish=data.draw(texts),
    metadata={data.draw(texts): data.draw(texts)},
  )
  other = jsonl.rollout_to_record(small_builder(), rollout_id="x", group_id=0, reward=0.0, unit_rewards=[0, 1])
  back, raw = roundtrip_file([rec, other])
  assert raw.count(b"\n") == 2  # one line per record, whatever the strings hold
  assert canon(back) == canon([rec, other])
  assert [m["content"] for m in back[0]["messages"]] == [joined(m["content"]) for m in messages]
  b2 = jsonl.record_to_builder(back[0])
  assert b2 == b
  assert [x.hex() for x in b2.behavior_logp] == [float(x).hex() for x in b.behavior_logp]
  assert (b2.num_turns, b2.unit) == (b.num_turns, b.unit)
  assert canon(back[0]["unit_rewards"]) == canon([float(x) for x in unit_rewards])


@given(
  st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=24),
  st.integers(0, 2**32 - 1),
)
def test_float32_arrays_roundtrip_bit_exact(vals, seed):
  arr = np.asarray(vals, np.float32)
  n = len(arr)
  b = RolloutBuilder.from_prompt([1, 2])
  b.append_action(list(range(3, 3 + n)), [float(x) for x in arr])
  (rec,), _ = roundtrip_file([jsonl.rollout_to_record(b, rollout_id="r", group_id=0, reward=float(arr[0]))])
  assert np.asarray(rec["behavior_logprobs"][2:], np.float32).tobytes() == arr.tobytes()
  assert np.float32(rec["reward"]).tobytes() == arr[:1].tobytes()
  traj, _ = jsonl.records_to_trajectory([rec], pad_id=0, length_bucket=8)
  assert traj.behavior_logp_BxL[0, 2 : 2 + n].tobytes() == arr.tobytes()
  assert traj.rewards_B.tobytes() == arr[:1].tobytes()
  # advantages of a credit run (float32) survive a second trip through the file
  adv = np.random.default_rng(seed).standard_normal((1, traj.tokens_BxL.shape[1])).astype(np.float32) * 1e3
  turn_adv = adv[:, :1] / np.float32(3)
  (credited,), _ = roundtrip_file(jsonl.attach_credit([rec], adv, turn_adv, method="trace"))
  assert (
    np.asarray(credited["advantages"], np.float32).tobytes()
    == np.concatenate([np.zeros(2, np.float32), adv[0, 2 : 2 + n]]).tobytes()
  )
  assert np.asarray(credited["turn_advantages"], np.float32).tobytes() == turn_adv[0].tobytes()


def test_float32_values_needing_17_digits():
  arr = np.asarray([0.1, 1 / 3, -1e-45, 3.4028235e38, -0.0, 2.0**-126, 16777217.0], np.float32)
  b = RolloutBuilder.from_prompt([1])
  b.append_action(list(range(len(arr))), [float(x) for x in arr])
  (rec,), raw = roundtrip_file([jsonl.rollout_to_record(b, rollout_id="r", group_id=0, reward=0.0)])
  assert b"0.10000000149011612" in raw and b"-0.0" in raw
  assert np.asarray(rec["behavior_logprobs"][1:], np.float32).tobytes() == arr.tobytes()


def test_rollout_result_defaults():
  b = small_builder()
  msgs = [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "a"},
    {"role": "tool", "content": "o"},
    {"role": "assistant", "content": "<answer>1</answer>"},
  ]
  res = RolloutResult(builder=b, env=None, reward=0.75, finish="answer", tool_calls=3, tool_errors=1, messages=msgs)
  rec = jsonl.rollout_to_record(res, rollout_id="r", group_id=2, unit_rewards=[0.0, 0.75], metadata={"seed": 9})
  assert (rec["reward"], rec["finish"], rec["group_id"]) == (0.75, "answer", 2)
  assert rec["messages"] == msgs and rec["messages"] is not msgs
  assert rec["metadata"] == {"tool_calls": 3, "tool_errors": 1, "seed": 9}
  assert (
    jsonl.rollout_to_record(res, rollout_id="r", group_id=2, reward=0.0, unit_rewards=[0, 0], finish="length")["reward"]
    == 0.0
  )
  with pytest.raises(ValueError, match="reward"):
    jsonl.rollout_to_record(b, rollout_id="r", group_id=0)
  with pytest.raises(TypeError):
    jsonl.rollout_to_record(object(), rollout_id="r", group_id=0, reward=0.0)
  with pytest.raises(ValueError, match="unit_rewards"):  # unit 1 reached, default [reward] covers unit 0 only
    jsonl.rollout_to_record(b, rollout_id="r", group_id=0, reward=0.0)
  with pytest.raises(ValueError, match="boundaries"):
    jsonl.rollout_to_record(
      RolloutBuilder(tokens=[1], action_mask=[False], turn_ids=[-1], behavior_logp=[0.0], unit_ids=[-1]),
      rollout_id="r",
      group_id=0,
      reward=0.0,
    )


def test_record_to_builder_defaults_for_minimal_record():
  rec = {
    "rollout_id": "r",
    "group_id": 0,
    "token_ids": [1, 2, 3, 4, 5],
    "action_mask": [0, 1, 1, 0, True],
    "turn_ids": [-1, 0, 0, -1, 1],
    "behavior_logprobs": [0, -1, -2, 0, -3],
    "boundaries": [1, 4],
    "prompt_len": 1,
    "reward": 1,
  }
  b = jsonl.record_to_builder(rec)
  assert b == RolloutBuilder(
    tokens=[1, 2, 3, 4, 5],
    action_mask=[False, True, True, False, True],
    turn_ids=[-1, 0, 0, -1, 1],
    behavior_logp=[0.0, -1.0, -2.0, 0.0, -3.0],
    boundaries=[1, 4],
    num_turns=2,
    unit_ids=[-1, 0, 0, -1, 0],
    unit=0,
  )
  assert all(type(x) is float for x in b.behavior_logp)
  assert jsonl.record_to_builder({**rec, "unit_rewards": [0, 0, 1]}).unit == 2
  assert jsonl.record_to_builder({**rec, "num_turns": 5}).num_turns == 5


# --------------------------------------------------------------------------------------------------- packing

FIELDS = [
  "tokens_BxL",
  "token_mask_BxL",
  "action_mask_BxL",
  "turn_ids_BxL",
  "behavior_logp_BxL",
  "boundary_pos_BxT1",
  "boundary_mask_BxT1",
  "turn_mask_BxT",
  "rewards_B",
  "sample_mask_B",
  "prompt_len_B",
  "unit_ids_BxL",
  "unit_rewards_BxU",
  "unit_mask_BxU",
]


@given(st.data())
def test_records_to_trajectory_any_order_equals_pack(data):
  n = data.draw(st.integers(1, 6))
  bs = [data.draw(builders(logp=logp32)) for _ in range(n)]
  gids = [data.draw(st.sampled_from(["a", "b", 0, 1, "0"])) for _ in range(n)]
  rewards = [data.draw(st.floats(-10, 10)) for _ in range(n)]
  unit_rewards = [data.draw(st.lists(st.floats(-10, 10), min_size=b.unit + 1, max_size=b.unit + 2)) for b in bs]
  records = [
    jsonl.rollout_to_record(b, rollout_id=f"r{i}", group_id=g, reward=r, unit_rewards=u)
    for i, (b, g, r, u) in enumerate(zip(bs, gids, rewards, unit_rewards))
  ]
  for i, b in enumerate(bs):  # some records rely on the default unit_rewards = [reward]
    if b.unit == 0 and len(unit_rewards[i]) == 1 and unit_rewards[i][0] == rewards[i]:
      del records[i]["unit_rewards"]
  perm = data.draw(st.permutations(range(n)))
  shuffled = [records[p] for p in perm]
  traj, mapping = jsonl.records_to_trajectory(shuffled, pad_id=7, length_bucket=8)
  dense = {}
  ref = pack(
    bs,
    rewards,
    [dense.setdefault(g, len(dense)) for g in gids],
    unit_rewards=unit_rewards,
    max_turns=max(1, max(b.num_turns for b in bs)),
    pad_id=7,
    length_bucket=8,
  )
  for f in FIELDS:
    got, want = getattr(traj, f), getattr(ref, f)[np.asarray(perm)]
    assert got.dtype == want.dtype, f
    np.testing.assert_array_equal(got, want, err_msg=f)
  # dense group ids: first appearance in the (shuffled) record order, one per original group_id
  assert list(mapping) == list(dict.fromkeys(gids[p] for p in perm))
  assert list(mapping.values()) == list(range(len(mapping)))
  assert traj.group_ids_B.tolist() == [mapping[gids[p]] for p in perm]
  assert traj.group_ids_B.dtype == np.int32
  same = traj.group_ids_B[:, None] == traj.group_ids_B[None, :]
  ref_g = ref.group_ids_B[np.asarray(perm)]
  np.testing.assert_array_equal(same, ref_g[:, None] == ref_g[None, :])


def test_group_ids_first_appearance_and_distinct_types():
  recs = [small_record(rollout_id=f"r{i}", group_id=g) for i, g in enumerate(["b", "a", "b", 7, "7", 0, 7])]
  recs[3]["token_ids"][0] = 99  # row 3 is record 3
  traj, mapping = jsonl.records_to_trajectory(recs, pad_id=0)
  assert traj.group_ids_B.tolist() == [0, 1, 0, 2, 3, 4, 2]
  assert mapping == {"b": 0, "a": 1, 7: 2, "7": 3, 0: 4} and list(mapping) == ["b", "a", 7, "7", 0]
  assert traj.tokens_BxL[:, 0].tolist() == [5, 5, 5, 99, 5, 5, 5]
  assert traj.max_turns == 2 and traj.tokens_BxL.shape[1] == 64
  assert jsonl.records_to_trajectory(recs, pad_id=0, max_turns=4)[0].max_turns == 4
  with pytest.raises(ValueError, match="max_turns"):
    jsonl.records_to_trajectory(recs, pad_id=0, max_turns=1)
  bad = [recs[0], dict(recs[1], turn_ids=[-1] * 7)]
  with pytest.raises(ValueError, match=r"record 1 \(rollout_id 'r1'\).*turn_ids\[3\]"):
    jsonl.records_to_trajectory(bad, pad_id=0)
  with pytest.raises(ValueError, match="empty"):
    jsonl.records_to_trajectory([], pad_id=0)
  huge = dict(recs[1], behavior_logprobs=[0.0] * 6 + [-1e39])
  with pytest.raises(ValueError, match=r"record 1 \(rollout_id 'r1'\): field 'behavior_logprobs\[6\]'.*float32"):
    jsonl.records_to_trajectory([recs[0], huge], pad_id=0)
  with pytest.raises(ValueError, match=r"record 0 .*'reward'"):
    jsonl.records_to_trajectory([dict(recs[0], reward=1e300)], pad_id=0)


# --------------------------------------------------------------------------------------------------- credit


def test_attach_credit():
  r0 = small_record(rollout_id="a")
  b1 = RolloutBuilder.from_prompt([1, 2])
  b1.append_action([3], [-0.1])
  r1 = jsonl.rollout_to_record(b1, rollout_id="b", group_id="g", reward=0.0)
  adv = np.arange(1, 17, dtype=np.float32).reshape(2, 8) / np.float32(7)
  turn_adv = np.asarray([[1.5, -2.5, 9.0], [0.25, 8.0, 9.0]], np.float32)
  out = jsonl.attach_credit([r0, r1], adv, turn_adv, method="gear")
  m0 = np.asarray(r0["action_mask"], bool)
  assert out[0]["advantages"] == [float(x) if a else 0.0 for x, a in zip(adv[0, :7], m0)]
  assert out[0]["advantages"][:3] == [0.0, 0.0, 0.0] and out[0]["advantages"][3] == float(adv[0, 3])
  assert out[1]["advantages"] == [0.0, 0.0, float(adv[1, 2])]
  assert out[0]["turn_advantages"] == [1.5, -2.5] and out[1]["turn_advantages"] == [0.25]
  assert out[0]["method"] == "gear"
  assert "advantages" not in r0 and out[0]["token_ids"] is not r0["token_ids"]  # originals untouched
  back, _ = roundtrip_file(out)
  assert canon(back) == canon(out)
  again = jsonl.attach_credit(out, adv * 2)  # a new credit run replaces the old credited fields
  assert "turn_advantages" not in again[0] and "method" not in again[0]
  assert again[1]["advantages"][2] == float(adv[1, 2] * 2)
  with pytest.raises(ValueError, match="shape"):
    jsonl.attach_credit([r0, r1], adv[:1])
  with pytest.raises(ValueError, match=r"record 0 \(rollout_id 'a'\) has 7 tokens"):
    jsonl.attach_credit([r0, r1], adv[:, :5])
  with pytest.raises(ValueError, match="turn_adv_BxT has only 1"):
    jsonl.attach_credit([r0, r1], adv, turn_adv[:, :1])
  with pytest.raises(ValueError, match="non-finite"):
    jsonl.attach_credit([r0, r1], np.where(np.arange(8) == 4, np.nan, adv))
  # a NaN off the action tokens is masked to 0.0, not an error
  assert jsonl.attach_credit([r1], np.asarray([[np.nan, 0, 1]]))[0]["advantages"] == [0.0, 0.0, 1.0]


# --------------------------------------------------------------------------------------------------- tool calls


def test_tool_calls_extraction():
  hidden = '<tool_call>{"name": "hidden", "arguments": {}}</tool_call>'
  a0 = "<think>plan " + hidden + "</think>ok " + tc.render_tool_call("calculator", {"expression": "1+1"})
  a1 = (
    tc.render_tool_call("search", {"q": "naïve </tool_call> ☃"})
    + "<tool_call>{not json}</tool_call>"
    + '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    + '<tool_call>{"arguments": {}}</tool_call>'
    + '<tool_call>{"name": "g", "arguments": [1]}</tool_call>'
    + "<think>"
    + hidden
    + "</think>"
    + tc.render_tool_call("h", {})
  )
  msgs = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": a0},
    {"role": "tool", "content": "<tool_response>2</tool_response>"},
    {"role": "assistant", "content": a1},
    {"role": "tool", "content": "three responses"},
    {"role": "assistant", "content": "<answer>2</answer>"},
  ]
  original = json.loads(json.dumps(msgs))
  rec = small_record(messages=msgs)
  out = rec["messages"]
  assert msgs == original  # the caller's messages are not modified
  assert [m["content"] for m in out] == [m["content"] for m in msgs]  # raw text kept
  assert out[2]["tool_calls"] == [
    {"id": "call_0_0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}
  ]
  assert out[3]["tool_call_id"] == "call_0_0"
  calls = out[4]["tool_calls"]
  assert [c["id"] for c in calls] == ["call_1_0", "call_1_1", "call_1_2"]
  assert [c["function"]["name"] for c in calls] == ["search", "f", "h"]
  assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"q": "naïve </tool_call> ☃"}, {"x": 1}, {}]
  assert "tool_call_id" not in out[5]  # three calls: no single id to answer
  assert "tool_calls" not in out[6] and "tool_calls" not in out[0]
  back, _ = roundtrip_file([rec])
  assert back[0]["messages"] == out


def test_tool_calls_edge_cases():
  many = "".join(tc.render_tool_call("f", {"i": i}) for i in range(20))
  assert [c["id"] for c in jsonl.extract_tool_calls(many, 3)] == [f"call_3_{k}" for k in range(20)]
  assert jsonl.extract_tool_calls("<think>" + many, 0) == []  # an unclosed think block hides the calls
  assert jsonl.extract_tool_calls(many[: -len("</tool_call>")], 0)[-1]["function"]["arguments"] == '{"i": 19}'
  assert jsonl.extract_tool_calls(None, 0) == [] and jsonl.extract_tool_calls("plain", 0) == []
  existing = [{"id": "abc", "type": "function", "function": {"name": "x", "arguments": "{}"}}]
  msgs = [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": tc.render_tool_call("f", {}), "tool_calls": existing},
    {"role": "tool", "content": "r"},
    {"role": "assistant", "content": None},
    {"role": "tool", "content": "r", "tool_call_id": "keep"},
  ]
  out = small_record(messages=msgs)["messages"]
  assert out[1]["tool_calls"] == existing and out[2]["tool_call_id"] == "abc"  # given tool_calls are kept
  assert out[4]["tool_call_id"] == "keep" and "tool_calls" not in out[3]


# --------------------------------------------------------------------------------------------------- errors


def set_(field, value):
  def f(rec):
    rec[field] = value

  return f


def item(field, i, value):
  def f(rec):
    rec[field][i] = value

  return f


BAD = [
  ("missing token_ids", lambda r: r.pop("token_ids"), "'token_ids': missing"),
  ("missing reward", lambda r: r.pop("reward"), "'reward': missing"),
  ("rollout_id int", set_("rollout_id", 3), "'rollout_id'"),
  ("group_id float", set_("group_id", 1.5), "'group_id'"),
  ("group_id bool", set_("group_id", True), "'group_id'"),
  ("token id negative", item("token_ids", 0, -1), "'token_ids[0]'"),
  ("token id float", item("token_ids", 2, 2.0), "'token_ids[2]'"),
  ("action_mask 2", item("action_mask", 4, 2), "'action_mask[4]'"),
  ("logprobs string", set_("behavior_logprobs", "x"), "'behavior_logprobs': expected a list"),
  ("logprobs short", lambda r: r["behavior_logprobs"].pop(), "'behavior_logprobs': has 6 entries but token_ids"),
  ("turn_ids long", lambda r: r["turn_ids"].append(-1), "'turn_ids': has 8 entries"),
  ("turn -1 on action", item("turn_ids", 3, -1), "'turn_ids[3]': is -1 on an action token"),
  ("turn on context", item("turn_ids", 0, 0), "'turn_ids[0]': is 0 on a non-action token"),
  ("turn decreasing", set_("turn_ids", [-1, -1, -1, 1, 1, -1, 0]), "'turn_ids[6]': is 0 after 1"),
  ("unit on context", item("unit_ids", 5, 1), "'unit_ids[5]'"),
  ("num_turns small", set_("num_turns", 1), "'num_turns'"),
  ("current_unit small", set_("current_unit", 0), "'current_unit'"),
  ("unit_rewards short", set_("unit_rewards", [1.0]), "'unit_rewards': has 1 entries"),
  ("unit_rewards missing", lambda r: r.pop("unit_rewards"), "'unit_rewards': missing"),
  ("prompt_len mismatch", set_("prompt_len", 2), "'boundaries': boundaries[0] = 3 differs from prompt_len = 2"),
  ("prompt_len zero", lambda r: (r.__setitem__("prompt_len", 0), r.__setitem__("boundaries", [0])), "'prompt_len'"),
  (
    "action in prompt",
    lambda r: (r.__setitem__("prompt_len", 4), r.__setitem__("boundaries", [4, 6])),
    "'action_mask': action_mask[3] = 1 inside the prompt",
  ),
  ("boundary past end", set_("boundaries", [3, 8]), "'boundaries[1]'"),
  ("boundaries empty", set_("boundaries", []), "'boundaries': is empty"),
  ("reward string", set_("reward", "1.0"), "'reward'"),
  ("finish int", set_("finish", 1), "'finish'"),
  ("bad role", set_("messages", [{"role": "bot", "content": "x"}]), "'messages[0].role'"),
  ("content list", set_("messages", [{"role": "user", "content": ["x"]}]), "'messages[0].content'"),
  (
    "tool_calls args dict",
    set_(
      "messages",
      [
        {
          "role": "assistant",
          "content": "",
          "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}],
        }
      ],
    ),
    "'messages[0].tool_calls[0].function.arguments'",
  ),
  ("metadata list", set_("metadata", []), "'metadata'"),
  ("advantages off action", set_("advantages", [0.5] + [0.0] * 6), "'advantages[0]': is 0.5 on a non-action"),
  ("turn_advantages count", set_("turn_advantages", [1.0]), "'turn_advantages': has 1 entries for 2 turns"),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in BAD], ids=[n for n, _, _ in BAD])
def test_read_errors_name_field_and_line(tmp_path, mutate, expected):
  good = small_record()
  bad = json.loads(json.dumps(good))
  mutate(bad)
  path = tmp_path / "r.jsonl"
  path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
  with pytest.raises(ValueError) as e:
    jsonl.read_jsonl(path)
  assert str(e.value).startswith(f"{path}, line 3: field ")
  assert expected in str(e.value)
  with pytest.raises(ValueError) as w:  # writing it is refused the same way
    jsonl.write_jsonl(tmp_path / "w.jsonl", [good, bad])
  named = "record 1: " if "'rollout_id'" in expected else "record 1 (rollout_id 'r0'): "
  assert str(w.value).startswith(named + "field ") and expected in str(w.value)
  assert not (tmp_path / "w.jsonl").exists()


@pytest.mark.parametrize(
  "line,expected",
  [
    ("{not json", "invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("[1, 2]", "field '<record>': expected a JSON object, got list"),
    (json.dumps(small_record()).replace('"reward": 1.0', '"reward": NaN'), "NaN is not standard JSON"),
    (json.dumps(small_record()).replace('"reward": 1.0', '"reward": -Infinity'), "-Infinity is not standard"),
  ],
)
def test_read_errors_bad_lines(tmp_path, line, expected):
  assert '"reward": 1.0' not in line
  path = tmp_path / "r.jsonl"
  path.write_text(json.dumps(small_record()) + "\n" + line + "\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"r\.jsonl, line 2: ") as e:
    jsonl.read_jsonl(path)
  assert expected in str(e.value)
  path.write_bytes(b"\n" + json.dumps(small_record()).encode()[:-2] + b"\xff}\n")
  with pytest.raises(ValueError, match=r"line 2: not valid UTF-8"):
    jsonl.read_jsonl(path)


def test_surrogates():
  content = "lone \ud800 x \udfff, pair \ud83d\ude00, emoji \U0001f600, nul \x00"
  rec = small_record(rollout_id="id \ud83d\ude00", messages=[{"role": "user", "content": content}])
  assert rec["rollout_id"] == "id \U0001f600"
  (back,), raw = roundtrip_file([rec])
  assert back == rec
  assert back["messages"][0]["content"] == "lone \ud800 x \udfff, pair \U0001f600, emoji \U0001f600, nul \x00"
  assert raw.isascii()  # a lone surrogate: the line is written with ASCII escapes
  (back,), raw = roundtrip_file([small_record(messages=[{"role": "user", "content": "中文 😀"}])])
  assert "中文 😀".encode() in raw and back["messages"][0]["content"] == "中文 😀"


def test_read_tolerates_crlf_bom_and_blank_lines(tmp_path):
  rec = small_record(messages=[{"role": "user", "content": "a\r\nb\u2028c"}])
  path = tmp_path / "r.jsonl"
  path.write_bytes(b"\xef\xbb\xbf" + json.dumps(rec).encode() + b"\r\n\r\n  \n" + json.dumps(rec).encode())
  assert jsonl.read_jsonl(path) == [rec, rec]


def test_write_rejects_non_finite_naming_field(tmp_path):
  rec = small_record()
  for field, value, expected in [
    ("reward", float("nan"), "'reward'"),
    ("behavior_logprobs", [0.0] * 6 + [float("-inf")], "'behavior_logprobs[6]'"),
    ("metadata", {"x": float("nan")}, "Out of range float"),
  ]:
    with pytest.raises(ValueError, match="record 0") as e:
      jsonl.write_jsonl(tmp_path / "w.jsonl", [{**rec, field: value}])
    assert expected in str(e.value)
  with pytest.raises(ValueError, match="'metadata': not JSON-serializable"):
    small_record(metadata={"x": float("inf")})
  with pytest.raises(ValueError, match="'metadata': not JSON-serializable"):
    small_record(metadata={"x": object()})


def test_field_tables_cover_the_layout():
  assert set(jsonl.REQUIRED_FIELDS) == {
    "rollout_id",
    "group_id",
    "token_ids",
    "action_mask",
    "turn_ids",
    "behavior_logprobs",
    "boundaries",
    "prompt_len",
    "reward",
  }
  written = set(small_record(tools=[]))
  assert written <= set(jsonl.REQUIRED_FIELDS) | set(jsonl.OPTIONAL_FIELDS)
  assert {"advantages", "turn_advantages", "method"} <= set(jsonl.OPTIONAL_FIELDS)


@pytest.mark.parametrize(
  "payload",
  [
    '{"name": "f", "name": "g", "arguments": {}}',
    '{"name": "f", "arguments": {"x": NaN}}',
    '{"name": "f", "arguments": {"x": 1e999}}',
    '{"name": "f", "arguments": {"x": -Infinity}}',
  ],
)
def test_export_skips_calls_that_are_not_strict_json(payload):
  """A call the environments refuse is no "tool_calls" entry of the export (a NaN argument used to be written as
  `NaN`, which no strict JSON reader takes; a duplicate name as the last-named tool)."""
  good = tc.render_tool_call("h", {"x": 1})
  calls = jsonl.extract_tool_calls("<tool_call>" + payload + "</tool_call>" + good, 0)
  assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("h", '{"x": 1}')]


# ----------------------------------------------------------------------------- token ids against the vocabulary


def test_token_ids_outside_the_vocabulary_are_refused_naming_file_line_and_field(tmp_path):
  """Issue 35 case 8: an action token 60000 of a 49152-token vocabulary was read (and credited) silently; -1 too
  must be named. Both are refused with the file, the line and the field."""
  good = small_record()
  big, negative = json.loads(json.dumps(good)), json.loads(json.dumps(good))
  big["token_ids"][4] = 60000  # an action token (turn 0)
  negative["token_ids"][4] = -1
  for bad, expected in ((big, "id 60000 is outside the vocabulary [0, 49152)"), (negative, "'token_ids[4]'")):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
      jsonl.read_jsonl(path, vocab_size=49152)
    assert str(e.value).startswith(f"{path}, line 2: field 'token_ids[4]': "), str(e.value)
    assert expected in str(e.value)
  path.write_text(json.dumps(good) + "\n" + json.dumps(big) + "\n", encoding="utf-8")
  assert len(jsonl.read_jsonl(path, vocab_size=60001)) == 2  # 60000 is inside a 60001-token vocabulary
  with pytest.raises(ValueError, match=r"record 1 \(rollout_id 'r0'\): field 'token_ids\[4\]': id 60000 is outside"):
    jsonl.records_to_trajectory([good, big], pad_id=0, vocab_size=49152)


@given(st.data())
def test_token_ids_are_accepted_exactly_inside_the_vocabulary(data):
  """Sweep: any id at any position (prompt, action, observation) against any vocabulary size is accepted iff
  0 <= id < vocab_size, and the error names the first bad position."""
  vocab = data.draw(st.integers(1, 2**31 - 1), label="vocab")
  rec = small_record()
  n = len(rec["token_ids"])
  ids = data.draw(
    st.lists(st.one_of(st.integers(-5, 2**31 - 1), st.integers(vocab - 2, vocab + 2)), min_size=n, max_size=n)
  )
  rec["token_ids"] = ids
  bad = [k for k, t in enumerate(ids) if not 0 <= t < vocab]
  if bad:
    with pytest.raises(ValueError, match=rf"field 'token_ids\[{bad[0]}\]'"):
      jsonl.check_token_ids(rec, vocab)
  else:
    jsonl.check_token_ids(rec, vocab)


# ----------------------------------------------------------------------- tokens the engine gave no log-prob


def test_a_token_without_an_engine_logprob_is_exported_as_null_and_flagged(tmp_path):
  """Issue 35 case 11 (export): a rollout holding a token whose engine log-prob is NaN (vLLM's null) or -inf could
  not be exported (NaN is not JSON) and nothing marked it. It is written as null with the rollout flagged by
  `engine_invalid_logp_tokens` (their count), and reads back as NaN."""
  b = RolloutBuilder.from_prompt([5, 6, 7])
  b.append_action([8, 9, 10], [-0.5, float("nan"), float("-inf")])
  rec = jsonl.rollout_to_record(b, rollout_id="r0", group_id=0, reward=1.0)
  assert rec["behavior_logprobs"] == [0.0, 0.0, 0.0, -0.5, None, None]
  assert rec["engine_invalid_logp_tokens"] == 2
  (back,), raw = roundtrip_file([rec])
  assert b'"behavior_logprobs":[0.0,0.0,0.0,-0.5,null,null]' in raw and b'"engine_invalid_logp_tokens":2' in raw
  again = jsonl.record_to_builder(back)
  assert again.behavior_logp[:4] == [0.0, 0.0, 0.0, -0.5] and all(np.isnan(again.behavior_logp[4:]))
  traj, _ = jsonl.records_to_trajectory([back], pad_id=0)
  assert np.isnan(traj.behavior_logp_BxL[0, 4:6]).all()
  fine = small_record()
  assert "engine_invalid_logp_tokens" not in fine  # only a rollout that holds such tokens is flagged


@pytest.mark.parametrize(
  "mutate, expected",
  [
    (item("behavior_logprobs", 0, None), "'behavior_logprobs[0]': is null on a non-action token"),
    (item("behavior_logprobs", 3, None), "'engine_invalid_logp_tokens': missing, but behavior_logprobs holds 1 null"),
    (set_("engine_invalid_logp_tokens", 1), "'engine_invalid_logp_tokens': is 1 but behavior_logprobs holds 0 null"),
    (set_("engine_invalid_logp_tokens", True), "'engine_invalid_logp_tokens': expected an int"),
  ],
)
def test_null_logprobs_and_their_flag_must_agree(mutate, expected):
  rec = json.loads(json.dumps(small_record()))
  mutate(rec)
  with pytest.raises(ValueError, match=re.escape(expected)):
    jsonl.validate_record(rec)
