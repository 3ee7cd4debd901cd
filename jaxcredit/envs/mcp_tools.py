"""Tasks whose tools come from MCP servers: `config.env.name = "mcp_tools"`.

A task set (a JSONL file, a Hugging Face `datasets` folder or a TFDS folder, read as `math_tools` reads them:
`jaxcredit.envs.sources`) gives the questions and gold answers; the tools are whatever the configured MCP servers
list (`servers`: commands the run starts and talks to over stdio, or Streamable HTTP URLs; the `mcp` SDK's
`Client`). Their schemas are written into the system prompt as Qwen3's template writes `tools=`
(`tool_calls.render_tools_prompt`); the policy calls them in the Qwen3 syntax (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, several per message), each call goes to the server that listed the tool, and the
results come back as one tool message (`<tool_response>` blocks, in order). A message without calls ends the
episode; its `<answer>...</answer>` is verified against the gold answer (`verifier`: "math_verify", the number as
math-verify reads it; or "exact", the text with case and surrounding whitespace ignored).

Per-call failures are observations, never the end of the run: an unknown tool, arguments the tool's schema refuses,
a result the server flags as an error (`is_error`), a call that takes longer than `timeout_s`, or a server that has
gone away each give "error: ..." in that call's tool response (counted in `info["tool_errors"]`). A server that
cannot be started or listed at start-up stops the run with one line (`spec.EnvironmentUnavailable`).

The connections live on one background event loop (the SDK is asyncio); each server's client is entered and left in
its own task, and calls run concurrently on its session (a call slower than `timeout_s` is cancelled). A stdio
server gets the run's environment variables. A server and its tools are listed once at start-up; names must be
unique across servers.

Teacher passes: the gold answer is the task's in `<answer>` tags (`math_tools.gold_answer_text`; as written with
the "exact" verifier), privileged information `math_tools.privileged_info` (the reference solution from
`info_field` when the source has one, and the gold answer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import shlex
import sys
import threading
from typing import Any

from jaxcredit.envs import episode, math_tools, spec, tool_calls

CONFIG_DEFAULTS: dict[str, Any] = {
  "servers": "",
  "source": "",
  "source_split": "train",
  "eval_source": "",
  "eval_split": "test",
  "eval_holdout": 64,
  "prompt_field": "question",
  "answer_field": "answer",
  "info_field": "",
  "id_field": "",
  "system_prompt": "Answer the question. Use the tools when they help. Write the final answer as <answer>...</answer>.",
  "verifier": "math_verify",
  "max_tool_calls": 4,
  "max_calls_per_message": 4,
  "max_output_chars": 2000,
  "timeout_s": 30.0,
  "startup_timeout_s": 60.0,
}
"""`config.env.mcp_tools`: the MCP servers (`servers`, ";"-separated: a command line run over stdio, "{python}" for
this Python, or an http(s):// Streamable HTTP URL), the task source as `math_tools` reads it (`source`,
`source_split`, `eval_source`, `eval_split`, `eval_holdout`, the field names), the system prompt before the tool
list, the verifier (`VERIFIERS`), the tool-call budget per rollout and per message, the characters of a result kept,
and the seconds a call (`timeout_s`) and a server's start and listing (`startup_timeout_s`) may take."""

VERIFIERS = ("math_verify", "exact")


class McpServers:
  """Clients of MCP servers on a background event loop, with a blocking `call` for the environments' threads.

  Args:
    targets: per server, a command (argv list: run over stdio) or an http(s):// URL (Streamable HTTP).
    timeout_s: the seconds one call may take before its result is an error.
    startup_timeout_s: the seconds a server may take to start and list its tools.

  Attributes:
    tools: tool name -> (server index, its schema as an OpenAI/Qwen3 function: name, description, parameters).

  Raises:
    spec.EnvironmentUnavailable: a server that does not start or list its tools in time (its error named), or two
      servers listing one tool name.
  """

  def __init__(self, targets: list[Any], *, timeout_s: float = 30.0, startup_timeout_s: float = 60.0):
    try:
      import mcp  # noqa: F401 - checked here, where a missing SDK can be named
    except ImportError:
      raise spec.EnvironmentUnavailable(
        'the mcp_tools environment needs the MCP SDK: pip install "jaxcredit[mcp]"'
      ) from None
    self.timeout_s = float(timeout_s)
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._loop.run_forever, name="jaxcredit-mcp", daemon=True)
    self._thread.start()
    self._stops: list[asyncio.Event] = []
    self._clients: list[Any] = []
    self._done: list[concurrent.futures.Future] = []
    self.dead: list[str | None] = []
    self.tools: dict[str, tuple[int, dict]] = {}
    try:
      for k, target in enumerate(targets):
        listed = self._start(k, target, startup_timeout_s)
        for tool in listed:
          if tool["name"] in self.tools:
            other = self.tools[tool["name"]][0]
            raise spec.EnvironmentUnavailable(
              f"MCP servers {other} and {k} both list a tool named {tool['name']!r}; names must be unique"
            )
          self.tools[tool["name"]] = (k, tool)
    except BaseException:
      self.close()
      raise

  def _start(self, k: int, target: Any, startup_timeout_s: float) -> list[dict]:
    listed: concurrent.futures.Future = concurrent.futures.Future()
    self.dead.append(None)
    self._clients.append(None)
    self._stops.append(None)
    done = asyncio.run_coroutine_threadsafe(self._serve(k, target, listed), self._loop)
    self._done.append(done)
    what = target if isinstance(target, str) else " ".join(target)
    try:
      tools = listed.result(timeout=startup_timeout_s)
    except concurrent.futures.TimeoutError:
      raise spec.EnvironmentUnavailable(
        f"the MCP server {what!r} did not start and list its tools within {startup_timeout_s:.0f} s"
      ) from None
    except Exception as e:  # noqa: BLE001 - whatever the SDK raised while connecting
      raise spec.EnvironmentUnavailable(f"the MCP server {what!r} did not start: {_one_line(e)}") from None
    print(f"[jaxcredit] MCP server {what}: {len(tools)} tools ({', '.join(t['name'] for t in tools)})")
    return tools

  async def _serve(self, k: int, target: Any, listed) -> None:
    """Server k's client, entered and left in this one task (the SDK's context must be); calls run as their own
    tasks on its session (`call`) until `close` sets the stop event."""
    from mcp import Client, StdioServerParameters

    stop = asyncio.Event()
    self._stops[k] = stop
    if isinstance(target, str):
      server = target
    else:  # the run's environment (API keys, PYTHONPATH, caches), not only the SDK's few default variables
      server = StdioServerParameters(command=target[0], args=list(target[1:]), env=dict(os.environ))
    try:
      async with Client(server, read_timeout_seconds=self.timeout_s) as client:
        result = await client.list_tools()
        self._clients[k] = client
        listed.set_result([_schema(t) for t in result.tools])
        await stop.wait()
    except BaseException as e:  # noqa: BLE001 - the server died or never started
      self.dead[k] = _one_line(e)
      if not listed.done():
        listed.set_exception(e)
      if not isinstance(e, Exception):
        raise
    finally:
      self._clients[k] = None

  def call(self, name: str, arguments: dict) -> tuple[str, bool]:
    """Calls tool `name` (listed by one of the servers) and waits at most `timeout_s`; calls to one server run
    concurrently, and one that times out is cancelled.

    Returns:
      (the result's text: its text blocks joined by newlines, other blocks as JSON; whether it is a success). A
      result the server flags `is_error`, a timeout, a server that is gone and an error the SDK raises are
      (`"error: ..."`, False).
    """
    k, _ = self.tools[name]
    client = self._clients[k]
    if self.dead[k] is not None or client is None:
      return f"error: the MCP server of {name!r} is gone ({self.dead[k] or 'closed'})", False
    answer = asyncio.run_coroutine_threadsafe(client.call_tool(name, arguments), self._loop)
    try:
      result = answer.result(timeout=self.timeout_s)
    except concurrent.futures.TimeoutError:
      answer.cancel()
      return f"error: {name} did not answer within {self.timeout_s:.0f} s", False
    except Exception as e:  # noqa: BLE001 - the SDK's or transport's error, shown to the policy
      return f"error: {name}: {_one_line(e)}", False
    text = _result_text(result)
    if _field(result, "is_error", "isError", False):
      return f"error: {text}", False
    return text, True

  def close(self) -> None:
    """Ends every client (their servers stop with their stdio) and the loop; idempotent."""
    if not self._loop.is_running():
      return
    for stop in self._stops:
      if stop is not None:
        self._loop.call_soon_threadsafe(stop.set)
    for done in self._done:
      try:
        done.result(timeout=10)
      except Exception:  # noqa: BLE001, S110 - closing: a server that died is closed already
        pass
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=10)


def _one_line(e: BaseException) -> str:
  if isinstance(e, BaseExceptionGroup) and e.exceptions:
    return _one_line(e.exceptions[0])
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _field(obj: Any, name: str, v1_name: str, default: Any) -> Any:
  """`obj.name` (the mcp SDK 2 spelling), else `obj.v1_name` (SDK 1), else `default`."""
  if hasattr(type(obj), name) or name in getattr(obj, "__dict__", {}) or name in getattr(type(obj), "model_fields", {}):
    return getattr(obj, name)
  return getattr(obj, v1_name, default)


def _schema(tool: Any) -> dict:
  parameters = _field(tool, "input_schema", "inputSchema", None) or {"type": "object"}
  return {"name": tool.name, "description": tool.description or "", "parameters": dict(parameters)}


def _result_text(result: Any) -> str:
  parts = []
  for block in getattr(result, "content", None) or []:
    text = getattr(block, "text", None)
    parts.append(text if isinstance(text, str) else json.dumps(block.model_dump(mode="json"), ensure_ascii=False))
  if not parts and getattr(result, "structured_content", None) is not None:
    parts.append(json.dumps(result.structured_content, ensure_ascii=False))
  return "\n".join(parts)


def server_targets(servers: str) -> list[Any]:
  """The targets of `config.env.mcp_tools.servers`: ";"-separated; an http(s):// URL as is, anything else a command
  line split like a shell ("{python}" replaced by this Python).

  Raises:
    ValueError: no server, or an empty entry.
  """
  entries = [s.strip() for s in servers.split(";")]
  if not servers.strip() or any(not s for s in entries):
    raise ValueError(
      f"config.env.mcp_tools.servers={servers!r}: give one or more servers separated by ';' (a command such as "
      f"'{{python}} my_server.py', or an http(s):// URL)"
    )
  out: list[Any] = []
  for s in entries:
    if s.startswith(("http://", "https://")):
      out.append(s)
    else:
      out.append([sys.executable if a == "{python}" else a for a in shlex.split(s)])
  return out


class McpToolsEpisode(episode.ToolEpisode):
  """One rollout: the policy's calls go to the MCP servers; a message without calls is the answer."""

  def __init__(self, task: math_tools.MathTask, cfg: _Config, servers: McpServers):
    super().__init__(task)
    self.cfg, self.servers = cfg, servers
    self.answer: str | None = None

  def step(self, assistant_text: str) -> spec.StepResult:
    info = self.begin_step()
    parsed = tool_calls.parse_message(assistant_text, max_calls=self.cfg.max_calls_per_message)
    if parsed.error is not None:  # an unclosed think block: nothing in the message runs
      return self._think_error(parsed.error)
    if not parsed.calls:
      self.answer = parsed.answer
      info["answered"] = self.answer is not None
      return self._finish("answer" if self.answer is not None else "no_answer")
    blocks = []
    for p in parsed.calls:
      if info["tool_calls"] >= self.cfg.max_tool_calls:
        info["budget_exhausted"] = True
        return self._finish("tool_budget")
      info["tool_calls"] += 1
      text, ok = self._run(p)
      info["tool_errors"] += 0 if ok else 1
      blocks.append(tool_calls.render_tool_response(tool_calls.truncate(text, self.cfg.max_output_chars)))
    return self._observe("\n".join(blocks))

  def _run(self, p) -> tuple[str, bool]:
    if p.call is None:
      return f"error: {p.error}", False
    listed = self.servers.tools.get(p.call.name)
    if listed is None:
      return f"error: unknown tool {p.call.name[:40]!r}; available: {', '.join(sorted(self.servers.tools))}", False
    problem = tool_calls.check_arguments(listed[1]["parameters"], p.call.arguments)
    if problem is not None:
      return f"error: {p.call.name}: {problem}", False
    return self.servers.call(p.call.name, dict(p.call.arguments))

  def reward(self) -> float:
    """1.0 when the answer passes the verifier, else 0.0."""
    if self.answer is None:
      return 0.0
    if self.cfg.verifier == "exact":
      return 1.0 if self.answer.strip().casefold() == self.task.answer.strip().casefold() else 0.0
    return math_tools.score_answer(self.task, self.answer)


@dataclasses.dataclass(frozen=True)
class _Config:
  system_prompt: str
  verifier: str
  max_tool_calls: int
  max_calls_per_message: int
  max_output_chars: int


def env_spec(node) -> spec.EnvSpec:
  """The MCP tools environment as an `EnvSpec` (the `ENVS["mcp_tools"]` row); starts the stdio servers and lists
  every server's tools.

  Raises:
    ValueError: a bad key, naming `config.env.mcp_tools.<key>`: no servers, no source, a verifier other than
      `VERIFIERS`, a budget < 1, timeouts <= 0.
    spec.EnvironmentUnavailable: a server that does not start, or tool names listed twice.
  """
  targets = server_targets(str(node.servers))
  if not str(node.source):
    raise ValueError("config.env.mcp_tools.source is empty: give the task source ('jsonl:/path/tasks.jsonl', ...)")
  if node.verifier not in VERIFIERS:
    raise ValueError(f"config.env.mcp_tools.verifier={node.verifier!r}: must be one of {VERIFIERS}")
  for key in ("max_tool_calls", "max_calls_per_message", "max_output_chars", "eval_holdout"):
    if int(node[key]) < 1:
      raise ValueError(f"config.env.mcp_tools.{key} must be >= 1, got {node[key]}")
  for key in ("timeout_s", "startup_timeout_s"):
    if not float(node[key]) > 0:
      raise ValueError(f"config.env.mcp_tools.{key} must be > 0, got {node[key]}")
  cfg = _Config(
    system_prompt=str(node.system_prompt),
    verifier=str(node.verifier),
    max_tool_calls=int(node.max_tool_calls),
    max_calls_per_message=int(node.max_calls_per_message),
    max_output_chars=int(node.max_output_chars),
  )
  fields = math_tools.FileFields(
    prompt_field=str(node.prompt_field),
    answer_field=str(node.answer_field),
    info_field=str(node.info_field),
    id_field=str(node.id_field),
  )

  def make_tasks(split: str, num: int | None, seed: int | None):
    return math_tools.make_file_tasks(
      split,
      num,
      seed,
      source=str(node.source),
      source_split=str(node.source_split),
      eval_source=str(node.eval_source),
      eval_split=str(node.eval_split),
      eval_holdout=int(node.eval_holdout),
      fields=fields,
    )

  servers = McpServers(targets, timeout_s=float(node.timeout_s), startup_timeout_s=float(node.startup_timeout_s))
  schemas = [tool for _, tool in servers.tools.values()]
  system = "\n\n".join(s for s in (cfg.system_prompt, tool_calls.render_tools_prompt(schemas)) if s)

  def initial_messages(task: math_tools.MathTask) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": task.question}]

  def gold_answer_text(task: math_tools.MathTask) -> str:
    if cfg.verifier == "exact":
      return tool_calls.render_answer(task.answer)
    return math_tools.gold_answer_text(task)

  def privileged_info(task: math_tools.MathTask) -> str:
    if cfg.verifier == "exact":  # the answer as the exact verifier takes it, not math_tools' number form
      solution = f"Reference solution:\n{task.solution}\n" if task.solution else ""
      return f"{solution}The final answer is {gold_answer_text(task)}"
    return math_tools.privileged_info(task)

  return spec.EnvSpec(
    make_tasks=make_tasks,
    make_env=lambda task: McpToolsEpisode(task, cfg, servers),
    initial_messages=initial_messages,
    stop_strings=(tool_calls.ANSWER_CLOSE,),
    max_turns=cfg.max_tool_calls + 1,
    is_success=lambda reward: reward > 0.5,
    demonstration=None,
    gold_answer_text=gold_answer_text,
    privileged_info=privileged_info,
    tools=lambda task: [{"type": "function", "function": s} for s in schemas],
    step_workers=8,
    close=servers.close,
  )
