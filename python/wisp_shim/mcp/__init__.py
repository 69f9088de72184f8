"""The MCP layer: the tools (one module each, in tools/), their arguments' checks (arguments) and
the `schema` subset (schema), the client's roots (client_roots), `respond` as an MCP task (tasks,
task_records), and the SDK's low-level Server that serves them (server)."""
