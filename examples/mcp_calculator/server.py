"""A small MCP tool server for jaxcredit's example config and tests: integer arithmetic tools over stdio.

Written with the `mcp` SDK's `MCPServer` (pip install "mcp>=2"); jaxcredit starts it as
`python examples/mcp_calculator/server.py` and talks to it over stdin/stdout (configs/mcp_calculator.py).

  python examples/mcp_calculator/server.py            # stdio (what jaxcredit starts)
  python examples/mcp_calculator/server.py --http 8000  # Streamable HTTP at http://127.0.0.1:8000/mcp
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calculator")


@server.tool()
def add(a: int, b: int) -> int:
  """Add two integers."""
  return a + b


@server.tool()
def multiply(a: int, b: int) -> int:
  """Multiply two integers."""
  return a * b


@server.tool()
def divide(a: int, b: int) -> int:
  """Divide a by b exactly; an error when b does not divide a."""
  if b == 0 or a % b:
    raise ToolError(f"{b} does not divide {a}")  # the caller's mistake: an error result, not a crash
  return a // b


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--http":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
  else:
    server.run()
