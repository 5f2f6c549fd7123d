"""The capture gateway: an OpenAI-compatible HTTP service between a harness and an engine.

It forwards every call under a rollout's session URL to the engine, asks the engine for the
exact ids, and writes one `TokenEntry` per sampled choice to a capture store before the
client gets the answer; a call it cannot capture is recorded lost, so its rollout masks.
Files, one concern each: `settings`, `guard` (keys, paths, limits), `dialects` (fields added
and removed), `engine` (HTTP to the engine), `answers` and `streams` (answers into calls),
`versions`, `capture` (store writes), `calls` and `stream_calls` (one call end to end),
`metrics`, `app` (the ASGI app), `serve` (the foreground server). docs/gateway.md says what
it records and refuses.
Importing `capture_core` does not import this package; it loads starlette, uvicorn, httpx
and prometheus_client, which only a gateway needs.
"""
