"""The MCP tools environment (jaxcredit/envs/mcp_tools.py) against real MCP servers: one written here with the `mcp`
SDK (echo, a slow tool, one that kills its server), the example calculator over stdio and over Streamable HTTP."""

import os
import subprocess
import sys
import textwrap
import time
import urllib.request

import ml_collections
import pytest

from jaxcredit.envs import make_env_spec, mcp_tools, spec, tool_calls
from jaxcredit.server_process import free_port
from tests.fixtures.tiny_run import ROOT

pytest.importorskip("mcp.server.mcpserver", reason="the mcp SDK serves the test tools")

CALCULATOR = os.path.join(ROOT, "examples", "mcp_calculator", "server.py")
TASKS = "jsonl:" + os.path.join(ROOT, "examples", "mcp_calculator", "tasks.jsonl")

TEST_SERVER = textwrap.dedent(
  """
  import os, time
  from mcp.server.mcpserver import MCPServer

  server = MCPServer("test-tools")

  @server.tool()
  def echo(text: str) -> str:
    '''Return the text.'''
    return text

  @server.tool()
  def slow(seconds: float) -> str:
    '''Sleep, then answer.'''
    time.sleep(seconds)
    return "awake"

  @server.tool()
  def die() -> str:
    '''End the server process.'''
    os._exit(1)

  server.run()
  """
)


@pytest.fixture(scope="module")
def test_server(tmp_path_factory):
  path = tmp_path_factory.mktemp("mcp") / "tools.py"
  path.write_text(TEST_SERVER)
  return str(path)


def _env(**settings):
  node = dict(mcp_tools.CONFIG_DEFAULTS, servers=f"{{python}} {CALCULATOR}", source=TASKS, eval_holdout=16)
  node.update(settings)
  return make_env_spec(ml_collections.ConfigDict({"name": "mcp_tools", "mcp_tools": node}))


def _call(name, **arguments):
  return tool_calls.render_tool_call(name, arguments, syntax="qwen3")


def test_tools_listed_calls_run_and_errors_are_observations(test_server):
  servers = mcp_tools.McpServers([[sys.executable, test_server]], timeout_s=3)
  try:
    assert sorted(servers.tools) == ["die", "echo", "slow"]
    schema = servers.tools["echo"][1]
    assert schema["description"] == "Return the text." and schema["parameters"]["required"] == ["text"]
    assert servers.call("echo", {"text": "héllo"}) == ("héllo", True)
    t0 = time.time()
    text, ok = servers.call("slow", {"seconds": 10})
    assert not ok and text == "error: slow did not answer within 3 s" and time.time() - t0 < 8
    assert servers.call("echo", {"text": "next"}) == ("next", True)  # the cancelled call holds nothing up
    text, ok = servers.call("die", {})
    assert not ok and text.startswith("error: die: ")
    time.sleep(0.5)
    text, ok = servers.call("echo", {"text": "still there?"})
    assert not ok and ("is gone" in text or "Connection closed" in text), text
  finally:
    servers.close()
  servers.close()  # idempotent


def test_a_server_that_does_not_start_is_refused_with_one_line(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("raise SystemExit('no tools today')\n")
  with pytest.raises(spec.EnvironmentUnavailable, match=r"the MCP server .*bad.py.* did not start"):
    mcp_tools.McpServers([[sys.executable, str(bad)]], startup_timeout_s=20)


def test_two_servers_may_not_list_one_name():
  with pytest.raises(spec.EnvironmentUnavailable, match="MCP servers 0 and 1 both list a tool named 'add'"):
    mcp_tools.McpServers([[sys.executable, CALCULATOR], [sys.executable, CALCULATOR]])


def test_an_episode_calls_the_calculator_server_and_is_verified():
  env = _env()
  try:
    held_out = env.make_tasks("eval", 16, None)
    train = env.make_tasks("train", 80, 0)
    assert not {t.question for t in held_out} & {t.question for t in train}
    task = train[0]
    system = env.initial_messages(task)[0]["content"]
    assert system.startswith(mcp_tools.CONFIG_DEFAULTS["system_prompt"]) and '"name": "multiply"' in system
    assert [s["function"]["name"] for s in env.tools(task)] == ["add", "multiply", "divide"]

    episode = env.make_env(task)
    first = episode.step(_call("add", a=2, b=3) + "\n" + _call("divide", a=3, b=2) + "\n" + _call("nope"))
    assert first.observation == "\n".join(
      [
        tool_calls.render_tool_response("5"),
        tool_calls.render_tool_response("error: Error executing tool divide: 2 does not divide 3"),
        tool_calls.render_tool_response("error: unknown tool 'nope'; available: add, divide, multiply"),
      ]
    )
    assert first.info["tool_calls"] == 3 and first.info["tool_errors"] == 2 and not first.done
    second = episode.step(_call("multiply", a="x", b=2))
    assert "error: multiply:" in second.observation and second.info["tool_errors"] == 3
    last = episode.step(f"The answer is {tool_calls.render_answer(task.answer)}")
    assert last.done and last.info["finish"] == "answer" and episode.reward() == 1.0
    wrong = env.make_env(task)
    assert wrong.step(tool_calls.render_answer("7")).done and wrong.reward() == 0.0
    assert env.gold_answer_text(task) == tool_calls.render_answer(task.answer)
    assert task.answer in env.privileged_info(task)
  finally:
    env.close()


def test_the_exact_verifier_and_its_teachers_read_the_answer_as_written():
  env = _env(verifier="exact")
  try:
    task = env.make_tasks("train", 1, 0)[0]
    assert env.gold_answer_text(task) == tool_calls.render_answer(task.answer)
    assert env.privileged_info(task) == f"The final answer is {tool_calls.render_answer(task.answer)}"
    episode = env.make_env(task)
    episode.step(tool_calls.render_answer(f" {task.answer} "))
    assert episode.reward() == 1.0
  finally:
    env.close()


def test_the_call_budget_ends_the_episode():
  env = _env(max_tool_calls=2)
  try:
    episode = env.make_env(env.make_tasks("train", 1, 0)[0])
    assert not episode.step(_call("add", a=1, b=1)).done
    ended = episode.step(_call("add", a=1, b=1) + _call("add", a=2, b=2))
    assert ended.done and ended.info["budget_exhausted"] and ended.info["finish"] == "tool_budget"
    assert env.max_turns == 3
  finally:
    env.close()


def test_an_http_server_is_reached_by_its_url():
  port = free_port()
  proc = subprocess.Popen([sys.executable, CALCULATOR, "--http", str(port)], stderr=subprocess.DEVNULL)
  try:
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.time() + 30
    while True:
      try:
        urllib.request.urlopen(url, timeout=1)
      except urllib.error.HTTPError:
        break  # answering (a GET without a session is refused)
      except OSError:
        assert time.time() < deadline, "the HTTP MCP server did not start"
        time.sleep(0.3)
    servers = mcp_tools.McpServers([url])
    try:
      assert servers.call("multiply", {"a": 6, "b": 7}) == ("42", True)
    finally:
      servers.close()
  finally:
    proc.terminate()
    proc.wait(10)


@pytest.mark.parametrize(
  ("settings", "match"),
  [
    (dict(servers=""), "config.env.mcp_tools.servers=''"),
    (dict(servers="a;;b"), "give one or more servers separated by ';'"),
    (dict(source=""), "config.env.mcp_tools.source is empty"),
    (dict(verifier="fuzzy"), "config.env.mcp_tools.verifier='fuzzy'"),
    (dict(max_tool_calls=0), "config.env.mcp_tools.max_tool_calls must be >= 1"),
    (dict(timeout_s=-1.0), "config.env.mcp_tools.timeout_s must be > 0"),
  ],
)
def test_bad_settings_are_refused_by_name(settings, match):
  with pytest.raises(ValueError, match=match):
    _env(**settings)
