"""Capture of LLM SDKs an agent already uses, one module per SDK, each imported only by
the agent that uses it (the SDK is an optional extra):

- :mod:`agent_blackbox.outbox.integrations.openai`: ``capture_openai(client, run)`` for
  the official ``openai`` SDK (``pip install 'agent-blackbox[openai]'``);
- :mod:`agent_blackbox.outbox.integrations.anthropic`: ``capture_anthropic(client, run)``
  for the official ``anthropic`` SDK (``pip install 'agent-blackbox[anthropic]'``):
  ``messages.create`` (with tools, ``stream=True``) and ``messages.stream``.

Both record the request body and the raw response JSON (a stream as its events) under
their provider's name, never a key, header or base URL, and hand back the SDK's own
objects in replay without a request.
"""
