"""Capture of LLM SDKs an agent already uses, one module per SDK, each imported only by
the agent that uses it (the SDK is an optional extra):

- :mod:`agent_blackbox.outbox.integrations.openai`: ``capture_openai(client, run)`` for
  the official ``openai`` SDK (``pip install 'agent-blackbox[openai]'``).
"""
