"""The MCP server (`agentstream mcp`, docs/mcp.md): agentstream's analytics, rewards, labels,
datasets and environments as tools of the Model Context Protocol, on the official `mcp` SDK.

- `config.py`: `McpConfig` (the command's options; loopback only for HTTP);
- `readonly.py`: the `sql` tool's read-only guard, row limit and time limit (pure check + one run);
- `json_trajectory.py`: a trajectory given as JSON through the rule layer and the assembler (pure);
- `data_tools.py`, `reward_tools.py`, `env_tools.py`: the tools, plain functions of the config and
  their arguments that call the CLI's own code paths (no second copy of a query or a score);
- `server.py`: the SDK wiring (tool declarations, error translation, the event-schema resources,
  stdio and streamable HTTP);
- `values.py`, `errors.py`: JSON-ready results and `McpToolError`.

Nothing here is imported by the layers below; the SDK is imported only when the server is built.
"""
