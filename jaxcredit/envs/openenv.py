"""OpenEnv environments as jaxcredit environments: `config.env.name = "openenv"`.

An OpenEnv environment (https://github.com/meta-pytorch/OpenEnv, `openenv-core` on the package index) is a server
with `reset` / `step` / `state` over a WebSocket (`/ws`), one environment instance per connection, whose
observations carry a reward and a done flag. This module is its client on the rollout side: each rollout holds one
WebSocket session for its whole episode, an assistant message becomes one action, the observation the server
answers becomes the next message, and the server's reward is the rollout's reward. The client speaks the protocol
of `openenv.core.env_server.http_server` (messages `{"type": "reset" | "step" | "close", "data": {...}}`, answers
`{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}` or `{"type": "error", ...}`) with
`websockets` alone: training needs neither openenv's server stack nor its client package (`pip install
"jaxcredit[openenv]"` installs websockets; serving an environment needs openenv-core, `pip install openenv-core`).

Tasks. GRPO-style credit compares the rollouts of one group, which must start from one state, so a task is a set
of `reset()` keyword arguments that the server resets to the same start every time: either the lines of two JSONL
files (`tasks` for training, `eval_tasks` held out; one JSON object of reset arguments per line) or seeds (`{seed_key: k}`: train task k of run seed s
resets with s * 1,000,003 + k, held-out task k with `eval_seed` + k). When the tasks are made, each is reset once
to read its prompt (the observation's `prompt_field`) and, where the environment exposes one, its gold answer
(`gold_field`); a rollout's session resets again and must see the same prompt (else the run stops: the server's
reset is not reproducible). Prompts are read concurrently (`max_concurrent` sessions).

Sessions. A rollout's session stays open from its first step to the end of its rollout, so the server must allow as
many sessions as rollouts are in flight: `rollout.prompts_per_step` x `rollout.group_size` during training (per
process) and `eval.batch_size` during evals (openenv-core's `max_concurrent_envs`, 1 by default). A refusal
(CAPACITY_REACHED) ends that episode as an error whose reason says so.

Actions and observations. An assistant message (its text as the model wrote it, `multiturn.action_text`) is sent
as the action `{action_field: text}`; the next message is the observation's `observation_field` (or, with "",
the whole observation as JSON), spoken by `observation_role`. The episode ends when the server says done, when it
has run `max_turns` assistant messages, or on an error. Reward: the last step's (`reward = "last"`) or the sum
over steps ("sum"); success is reward >= `success_threshold`.

Errors. A session that cannot be opened, an error answer, a malformed answer, a closed connection or a message
that takes longer than `timeout_s` ends that episode with finish "env_error" and the reason in
`info["env_error"]`; the episode is left out of the update (`jaxcredit.train.loop.rl_step`) and counted in the step's
`env/openenv_errors`. When every episode of a step ends that way the server is gone, and the step raises
`spec.EnvironmentUnavailable` (`jaxcredit train` prints one line and exits 1; checkpoints and metrics already
written stay).

Teacher passes. TRACE's gold-answer scoring, CrEST's, GEAR's and HSD's privileged teachers need a gold answer:
with `gold_field` = "" the environment has none, and `config.validate` refuses those methods (the `EnvSpec`'s
`gold_answer_text` is None).

Server. `url` names a running server (http://host:port or ws://host:port); or `command` starts one when the
environment is built (as the vLLM engine does): "{port}" in it is replaced by a free port and "{python}" by this
process's Python, its output goes to
`log` (default: a file in the temporary folder, printed), and it is stopped when the run ends (and when this
process dies).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

from jaxcredit.envs import episode, spec

CONFIG_DEFAULTS: dict[str, Any] = {
  "url": "",
  "command": "",
  "cwd": "",
  "log": "",
  "startup_timeout_s": 120.0,
  "timeout_s": 30.0,
  "max_concurrent": 8,
  "tasks": "",
  "eval_tasks": "",
  "seed_key": "seed",
  "eval_seed": 1_000_000_000,
  "prompt_field": "prompt",
  "system_prompt": "",
  "action_field": "message",
  "observation_field": "",
  "observation_role": "tool",
  "gold_field": "",
  "reward": "last",
  "success_threshold": 1.0,
  "max_turns": 4,
}
"""`config.env.openenv`: the server (`url`, or `command` run from `cwd` with its output in `log`, waited for up to
`startup_timeout_s`), the seconds one message may take (`timeout_s`), the sessions open at once while prompts are
read and steps run (`max_concurrent`), the tasks (`tasks` and `eval_tasks`, JSONL files of reset arguments, or
seeds under `seed_key`, held-out ones from `eval_seed`), the mapping (`prompt_field`, `system_prompt`, `action_field`, `observation_field`,
`observation_role`, `gold_field`), the reward (`reward`, `success_threshold`) and `max_turns`."""

REWARDS = ("last", "sum")
ROLES = ("tool", "user")
TRAIN_SEED_STRIDE = 1_000_003
ENV_ERROR = "env_error"
"""The finish reason of an episode the server failed (`info["env_error"]` says why)."""


class OpenEnvError(RuntimeError):
  """One session's failure: the server refused, answered an error or garbage, closed, or timed out."""


@dataclasses.dataclass(frozen=True)
class OpenEnvTask:
  """One task of an OpenEnv environment.

  Attributes:
    task_id: "<split>/<k>" (seeds) or "<split>/<line>" (a tasks file).
    reset_kwargs: the keyword arguments of the server's `reset()` (a JSON object).
    prompt: the first user message, read from the reset observation's `prompt_field`.
    gold: the reset observation's `gold_field`, or None when the environment exposes none.
  """

  task_id: str
  reset_kwargs: dict = dataclasses.field(hash=False)
  prompt: str = ""
  gold: str | None = None


def ws_url(url: str) -> str:
  """The WebSocket endpoint of a server URL: http(s)://h:p -> ws(s)://h:p/ws; a URL with a path (behind a proxy:
  http://h/prefix/ws) keeps it, only its scheme changed.

  Raises:
    ValueError: a URL of another scheme (naming `config.env.openenv.url`).
  """
  url = url.strip().rstrip("/")
  for http, ws in (("http://", "ws://"), ("https://", "wss://")):
    if url.startswith(http):
      url = ws + url[len(http) :]
  if not url.startswith(("ws://", "wss://")):
    raise ValueError(f"config.env.openenv.url={url!r}: expected http://host:port or ws://host:port")
  host_and_path = url.split("://", 1)[1]
  return url if "/" in host_and_path else url + "/ws"


class Session:
  """One WebSocket session with an OpenEnv server: one environment instance, from `reset` to `close`.

  Args:
    url: the server (http://, ws://; `ws_url`).
    timeout_s: the seconds one message (connect, reset, step) may take.

  Raises (every method):
    OpenEnvError: the connection failed or closed, the server answered an error or something that is not an
      observation, or it took longer than `timeout_s`.
  """

  def __init__(self, url: str, timeout_s: float):
    try:
      from websockets.sync.client import connect
    except ImportError:
      raise spec.EnvironmentUnavailable(
        'the openenv environment\'s client needs websockets: pip install "jaxcredit[openenv]"'
      ) from None

    self.url, self.timeout_s = ws_url(url), float(timeout_s)
    self._stack = contextlib.ExitStack()
    try:
      # Entered as a context manager (websockets' supported way), left in `close`.
      self._ws = self._stack.enter_context(
        connect(self.url, open_timeout=self.timeout_s, close_timeout=2.0, max_size=2**24)
      )
    except Exception as e:  # noqa: BLE001 - every way of not connecting is one error for the episode
      raise OpenEnvError(f"cannot open a session at {self.url}: {_one_line(e)}") from None

  def _ask(self, message: dict) -> dict:
    try:
      self._ws.send(json.dumps(message))
      raw = self._ws.recv(timeout=self.timeout_s)
    except TimeoutError:
      raise OpenEnvError(f"no answer to {message['type']} within {self.timeout_s:.0f} s") from None
    except Exception as e:  # noqa: BLE001 - a closed connection, a reset socket, ...
      raise OpenEnvError(f"{message['type']} failed: {_one_line(e)}") from None
    try:
      answer = json.loads(raw)
    except (TypeError, ValueError):
      raise OpenEnvError(
        f"{message['type']}: the server answered something that is not JSON: {str(raw)[:200]}"
      ) from None
    kind = answer.get("type") if isinstance(answer, dict) else None
    data = answer.get("data") if isinstance(answer, dict) else None
    if kind == "error":
      detail = data.get("message", data) if isinstance(data, dict) else data
      code = data.get("code", "") if isinstance(data, dict) else ""
      hint = ""
      if code == "CAPACITY_REACHED":
        hint = (
          " (the server allows fewer sessions than there are rollouts in flight: rollout.prompts_per_step x "
          "rollout.group_size in training, eval.batch_size in evals; raise its max_concurrent_envs)"
        )
      raise OpenEnvError(
        f"{message['type']}: the server answered an error{f' ({code})' if code else ''}: {detail}{hint}"
      )
    if kind != "observation" or not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
      raise OpenEnvError(f"{message['type']}: expected an observation, the server answered {str(answer)[:200]}")
    done = data.get("done", False)
    reward = data.get("reward")
    if not isinstance(done, bool) or (reward is not None and not isinstance(reward, (int, float))):
      raise OpenEnvError(f"{message['type']}: malformed observation (done={done!r}, reward={reward!r})")
    return data

  def reset(self, kwargs: dict) -> dict:
    """`reset(**kwargs)`: {"observation": {...}, "reward": r | None, "done": bool}."""
    return self._ask({"type": "reset", "data": dict(kwargs)})

  def step(self, action: dict) -> dict:
    """`step(action)`: {"observation": {...}, "reward": r | None, "done": bool}."""
    return self._ask({"type": "step", "data": dict(action)})

  def close(self) -> None:
    """Ends the session (the server frees its environment); idempotent, never raises."""
    ws, self._ws = getattr(self, "_ws", None), None
    if ws is None:
      return
    try:
      ws.send(json.dumps({"type": "close"}))
      ws.recv(timeout=2.0)  # the server closes its side: a clean close, no abnormal-closure traceback in its log
    except Exception:  # noqa: BLE001, S110 - the session is over either way (ConnectionClosedOK expected)
      pass
    try:
      self._stack.close()
    except Exception:  # noqa: BLE001, S110
      pass


def _one_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def field_text(observation: dict, name: str, *, what: str) -> str:
  """The text of observation field `name` ("" = the whole observation as JSON); a non-string value as JSON.

  Raises:
    OpenEnvError: the observation has no field `name` (listing the fields it has).
  """
  if not name:
    return json.dumps(observation, ensure_ascii=False, sort_keys=True)
  if name not in observation:
    raise OpenEnvError(f"the observation has no field {name!r} ({what}); its fields: {sorted(observation)}")
  value = observation[name]
  return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


class OpenEnvEpisode(episode.ToolEpisode):
  """One rollout's episode on an OpenEnv server: its session is opened and reset at the first `step`, so the
  episodes of a turn open their sessions concurrently (`EnvSpec.step_workers`).

  info adds "env_error" (None, or why the server failed the episode) and "env_steps" (actions the server took).
  """

  def __init__(self, task: OpenEnvTask, cfg: _Config):
    super().__init__(task, env_error=None, env_steps=0)
    self.cfg = cfg
    self.session: Session | None = None
    self.rewards: list[float] = []

  def _open(self) -> None:
    self.session = Session(self.cfg.url, self.cfg.timeout_s)
    first = self.session.reset(self.task.reset_kwargs)
    prompt = field_text(first["observation"], self.cfg.prompt_field, what="config.env.openenv.prompt_field")
    if prompt != self.task.prompt:
      raise spec.EnvironmentUnavailable(
        f"the OpenEnv server's reset({self.task.reset_kwargs}) gave another prompt than when task "
        f"{self.task.task_id} was made ({prompt[:80]!r} vs {self.task.prompt[:80]!r}): its reset is not reproducible "
        f"from these arguments, and a group's rollouts must start from one state; give tasks that fix the episode "
        f"(config.env.openenv.tasks, or a seed the environment honours: config.env.openenv.seed_key)"
      )

  def step(self, assistant_text: str) -> spec.StepResult:
    info = self.begin_step()
    try:
      if self.session is None:
        self._open()
      out = self.session.step({self.cfg.action_field: assistant_text})
      info["env_steps"] += 1
      info["tool_calls"] += 1
      if out.get("reward") is not None:
        self.rewards.append(float(out["reward"]))
      if out["done"]:
        info["answered"] = True
        self.close()
        return self._finish("done")
      text = field_text(out["observation"], self.cfg.observation_field, what="config.env.openenv.observation_field")
    except OpenEnvError as e:
      info["env_error"] = str(e)
      info["tool_errors"] += 1
      self.close()
      return self._finish(ENV_ERROR)
    return self._observe(text, self.cfg.observation_role)

  def reward(self) -> float:
    """The last step's reward (`reward = "last"`) or their sum ("sum"); 0.0 before any, and after a server error."""
    if self.info["env_error"] is not None or not self.rewards:
      return 0.0
    return self.rewards[-1] if self.cfg.reward == "last" else float(sum(self.rewards))

  def close(self) -> None:
    """Closes the session (idempotent): at done, on an error, and by the rollout loop at the end of the rollout."""
    if self.session is not None:
      self.session.close()


@dataclasses.dataclass(frozen=True)
class _Config:
  url: str
  timeout_s: float
  max_concurrent: int
  tasks: str
  eval_tasks: str
  seed_key: str
  eval_seed: int
  prompt_field: str
  system_prompt: str
  action_field: str
  observation_field: str
  observation_role: str
  gold_field: str
  reward: str
  success_threshold: float
  max_turns: int


def read_task_file(path: str) -> list[dict]:
  """The reset arguments of a tasks file: one JSON object per non-empty line.

  Raises:
    FileNotFoundError: no such file (naming `config.env.openenv.tasks`).
    ValueError: a line that is not a JSON object (its number).
  """
  p = Path(os.path.expanduser(path))
  if not p.is_file():
    raise FileNotFoundError(f"config.env.openenv.tasks={path!r}: no such file")
  out = []
  for n, line in enumerate(p.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path}, line {n}: not JSON ({e})") from None
    if not isinstance(row, dict):
      raise ValueError(f"{path}, line {n}: a task is a JSON object of reset() arguments, got {type(row).__name__}")
    out.append(row)
  return out


def make_tasks(cfg: _Config, split: str, num: int, seed: int | None) -> list[OpenEnvTask]:
  """`num` tasks of `split`, each reset once on the server to read its prompt (and gold answer).

  From the tasks files (`tasks` for train, `eval_tasks` for held-out: their first `num` lines, in order), or
  from seeds (the module notes).

  Raises:
    ValueError: more tasks asked of a tasks file than it has.
    spec.EnvironmentUnavailable: the server failed while the prompts were read (the first failure, named).
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  path = cfg.eval_tasks if split == "eval" else cfg.tasks
  if path:
    rows = read_task_file(path)
    if len(rows) < num:
      key = "eval_tasks" if split == "eval" else "tasks"
      raise ValueError(f"config.env.openenv.{key}={path!r} has {len(rows)} tasks; {num} {split} tasks were asked")
    chosen = [(f"{split}/{k}", rows[k]) for k in range(num)]
  else:
    base = cfg.eval_seed if split == "eval" else int(seed or 0) * TRAIN_SEED_STRIDE
    chosen = [(f"{split}/{k}", {cfg.seed_key: base + k}) for k in range(num)]

  def read(item):
    task_id, kwargs = item
    session = Session(cfg.url, cfg.timeout_s)
    try:
      obs = session.reset(kwargs)["observation"]
      prompt = field_text(obs, cfg.prompt_field, what="config.env.openenv.prompt_field")
      gold = field_text(obs, cfg.gold_field, what="config.env.openenv.gold_field") if cfg.gold_field else None
    finally:
      session.close()
    return OpenEnvTask(task_id, dict(kwargs), prompt, gold)

  try:
    with concurrent.futures.ThreadPoolExecutor(max(1, min(cfg.max_concurrent, len(chosen) or 1))) as pool:
      return list(pool.map(read, chosen))
  except OpenEnvError as e:
    raise spec.EnvironmentUnavailable(
      f"reading the {split} tasks' prompts from the OpenEnv server at {cfg.url}: {e}"
    ) from None


def env_errors(envs) -> dict[str, float]:
  """The step's `env/openenv_errors` (share of episodes the server failed) and `env/openenv_env_steps` (mean
  actions per episode).

  Raises:
    spec.EnvironmentUnavailable: every episode failed (the server is gone: the first reason, named).
  """
  envs = list(envs)
  if not envs:
    return {}
  failed = [e for e in envs if e.info.get("env_error")]
  if len(failed) == len(envs):
    raise spec.EnvironmentUnavailable(
      f"all {len(envs)} episodes of this step failed on the OpenEnv server; the first: {failed[0].info['env_error']}"
    )
  return {
    "openenv_errors": len(failed) / len(envs),
    "openenv_env_steps": sum(e.info["env_steps"] for e in envs) / len(envs),
  }


_LAUNCHED: dict[tuple, Any] = {}
_LAUNCH_LOCK = threading.Lock()


def _health(url: str) -> bool:
  base = url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/")
  with urllib.request.urlopen(f"{base}/health", timeout=2.0) as response:
    return response.status == 200


def start_server(command: str, *, cwd: str = "", log: str = "", startup_timeout_s: float = 120.0):
  """Starts `command` ("{port}" replaced by a free port, "{python}" by this Python) and waits for its `GET /health`; one server per
  (command, cwd) in this process (a second call returns the first while it runs).

  Returns:
    The `jaxcredit.server_process.ServerProcess` (its `url`: http://127.0.0.1:<port>).

  Raises:
    spec.EnvironmentUnavailable: the command exited or did not answer in time (the end of its log).
  """
  from jaxcredit import server_process

  key = (command, cwd)
  with _LAUNCH_LOCK:
    running = _LAUNCHED.get(key)
    if running is not None and running.running():
      return running
    port = server_process.free_port()
    cmd = shlex.split(command.replace("{port}", str(port)).replace("{python}", shlex.quote(sys.executable)))
    if not cmd:
      raise ValueError("config.env.openenv.command is empty")
    url = f"http://127.0.0.1:{port}"
    log_path = log or os.path.join(tempfile.gettempdir(), f"jaxcredit-openenv-{port}.log")
    print(f"[jaxcredit] starting the OpenEnv server: {' '.join(cmd)} (its log: {log_path})")
    env = dict(os.environ)
    for k in ("XLA_FLAGS", "JAX_PLATFORMS"):
      env.pop(k, None)
    server = server_process.launch(
      cmd,
      url=url,
      ready=lambda: _health(url),
      log_path=log_path,
      what="the OpenEnv server",
      error=spec.EnvironmentUnavailable,
      env=env,
      cwd=cwd or None,
      startup_timeout_s=startup_timeout_s,
      poll_s=0.5,
    )
    print(f"[jaxcredit] OpenEnv server ready at {url} (pid {server.pid})")
    _LAUNCHED[key] = server
    return server


def env_spec(node) -> spec.EnvSpec:
  """The OpenEnv environment as an `EnvSpec` (the `ENVS["openenv"]` row); starts the server when `command` is set.

  Raises:
    ValueError: a bad key, naming `config.env.openenv.<key>`: neither or both of url and command, a reward other
      than `REWARDS`, an observation role other than `ROLES`, max_turns or max_concurrent < 1, timeouts <= 0, an
      empty action_field.
    spec.EnvironmentUnavailable: a command that does not start.
  """
  url, command = str(node.url).strip(), str(node.command).strip()
  if bool(url) == bool(command):
    raise ValueError(
      "config.env.openenv: set exactly one of url (a running server) and command (one the run starts); got "
      f"url={url!r}, command={command!r}"
    )
  if url:
    ws_url(url)  # refuses another scheme, naming the key
  if node.reward not in REWARDS:
    raise ValueError(f"config.env.openenv.reward={node.reward!r}: must be one of {REWARDS}")
  if node.observation_role not in ROLES:
    raise ValueError(f"config.env.openenv.observation_role={node.observation_role!r}: must be one of {ROLES}")
  for key in ("max_turns", "max_concurrent"):
    if int(node[key]) < 1:
      raise ValueError(f"config.env.openenv.{key} must be >= 1, got {node[key]}")
  for key in ("timeout_s", "startup_timeout_s"):
    if not float(node[key]) > 0:
      raise ValueError(f"config.env.openenv.{key} must be > 0, got {node[key]}")
  if not str(node.action_field):
    raise ValueError("config.env.openenv.action_field is empty: the action's text field must be named")
  if bool(str(node.tasks)) != bool(str(node.eval_tasks)):
    raise ValueError(
      "config.env.openenv: tasks (train) and eval_tasks (held-out) are given together, two files that share no "
      f"task, or neither (seeds); got tasks={node.tasks!r}, eval_tasks={node.eval_tasks!r}"
    )
  if not str(node.seed_key) and not str(node.tasks):
    raise ValueError("config.env.openenv: without tasks files, seed_key names the reset() argument of the seed")
  server = None
  if command:
    server = start_server(
      command, cwd=str(node.cwd), log=str(node.log), startup_timeout_s=float(node.startup_timeout_s)
    )
    url = server.url
  cfg = _Config(
    url=url,
    timeout_s=float(node.timeout_s),
    max_concurrent=int(node.max_concurrent),
    tasks=str(node.tasks),
    eval_tasks=str(node.eval_tasks),
    seed_key=str(node.seed_key),
    eval_seed=int(node.eval_seed),
    prompt_field=str(node.prompt_field),
    system_prompt=str(node.system_prompt),
    action_field=str(node.action_field),
    observation_field=str(node.observation_field),
    observation_role=str(node.observation_role),
    gold_field=str(node.gold_field),
    reward=str(node.reward),
    success_threshold=float(node.success_threshold),
    max_turns=int(node.max_turns),
  )

  def initial_messages(task: OpenEnvTask) -> list[dict]:
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return [*system, {"role": "user", "content": task.prompt}]

  def gold_answer_text(task: OpenEnvTask) -> str:
    return task.gold or ""

  def privileged_info(task: OpenEnvTask) -> str:
    return f"The correct final answer: {task.gold}"

  has_gold = bool(cfg.gold_field)
  return spec.EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(cfg, split, num, seed),
    make_env=lambda task: OpenEnvEpisode(task, cfg),
    initial_messages=initial_messages,
    stop_strings=(),
    max_turns=cfg.max_turns,
    is_success=lambda reward: reward >= cfg.success_threshold,
    demonstration=None,
    gold_answer_text=gold_answer_text if has_gold else None,
    privileged_info=privileged_info if has_gold else None,
    metrics=env_errors,
    step_workers=cfg.max_concurrent,
    close=server.stop if server is not None else None,
  )
