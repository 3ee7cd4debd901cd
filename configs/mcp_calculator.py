"""TRACE on questions whose tools come from an MCP server: examples/mcp_calculator (add, multiply, divide over stdio).

The run starts `python examples/mcp_calculator/server.py` and connects with the `mcp` SDK's client, lists its tools
into the system prompt (Qwen3's tool prompt), sends each `<tool_call>` to it and returns the results as tool
messages; answers are verified by math-verify against examples/mcp_calculator/tasks.jsonl (16 held out). The server
stops with the run (docs/environments.md, "`mcp_tools` (tools from MCP servers)"; run it from the repository root, with a model that writes Qwen3 tool calls). Needs the `mcp` SDK (pip install "mcp>=2"):

  jaxcredit train --config configs/mcp_calculator.py
  jaxcredit train --config configs/mcp_calculator.py --config.env.mcp_tools.servers=http://127.0.0.1:8000/mcp
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/mcp_calculator"
  c.credit.method = "trace"
  c.env.name = "mcp_tools"
  m = c.env.mcp_tools
  m.servers = "{python} examples/mcp_calculator/server.py"
  m.source = "jsonl:examples/mcp_calculator/tasks.jsonl"
  m.eval_holdout = 16
  m.max_tool_calls = 3
  c.env.num_train_tasks = 80
  c.eval.num_tasks = 16
  c.sft.steps = 0  # the task file has no demonstrations
  c.sampling.max_new_tokens = 64
  c.sampling.max_len = 1024
  c.total_steps = 4
  return c
