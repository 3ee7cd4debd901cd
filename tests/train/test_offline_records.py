"""Rollout records read for `jaxcredit credit` (issue 54 case 10): a key named twice in one record is refused (json
kept the last silently), and a record whose task_id names another task than its prompt asks is refused (it was
credited with the named task's gold answer)."""

import json

import pytest

from jaxcredit.envs import make_env_spec
from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.train.config import base_config
from jaxcredit.train.commands.offline_credit import tasks_of_records


def test_a_key_named_twice_is_refused_naming_the_line(tmp_path):
  path = tmp_path / "r.jsonl"
  path.write_text('{"rollout_id": "a", "rollout_id": "b", "token_ids": [1]}\n')
  with pytest.raises(ValueError, match=r"r.jsonl, line 1: invalid JSON \(the key 'rollout_id' appears twice"):
    jsonl_lib.read_jsonl(path)


def test_a_task_id_that_names_another_task_than_the_prompt_is_refused():
  env = make_env_spec(base_config().env)
  tasks = env.make_tasks("eval", 2, None)
  ids = [t.task_id for t in tasks]
  record = {"rollout_id": "r0", "task_id": ids[0], "messages": env.initial_messages(tasks[0])}
  assert tasks_of_records(env, tasks, [record], source="f", need="TRACE's gold answers") == [tasks[0]]
  lying = dict(record, task_id=ids[1])
  with pytest.raises(ValueError, match=rf"rollout 'r0' has task_id '{ids[1]}', but its prompt .* is not that task's"):
    tasks_of_records(env, tasks, [lying], source="f", need="TRACE's gold answers")
  bare = {"rollout_id": "r1", "task_id": ids[1]}  # no messages: the id alone decides, as before
  assert tasks_of_records(env, tasks, [bare], source="f", need="x") == [tasks[1]]
  json.dumps(record)  # the record is plain JSON
