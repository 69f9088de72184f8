"""The transport layer: JSON-RPC lines as a client sends them. stdio on asyncio pipes (stdio),
the request-id budget and the lines the SDK drops (guard), the one judgement of ids and envelopes
that the shared server applies too (request_ids), and what both take from the SDK beyond its
documented API (sdk_seams)."""
