"""agent-blackbox: a flight recorder for AI agents.

The parts, each a subpackage with its public surface in its ``__init__``:

- :mod:`agent_blackbox.schemas`: the contract (envelope, Avro schemas, canonical JSON,
  digests, codecs, migrators). A leaf: it imports no other part.
- :mod:`agent_blackbox.outbox`: the write side an agent imports (the Recorder SDK, the
  record/replay boundary contract, redaction, the write side's tables). The relay
  (:mod:`agent_blackbox.outbox.relay`) and the LLM SDK integrations
  (:mod:`agent_blackbox.outbox.integrations`) load only when imported.
- :mod:`agent_blackbox.keystore`: data keys, key providers and audited unwrapping.
- :mod:`agent_blackbox.broker`: the Kafka client layer every other part uses.
- :mod:`agent_blackbox.consumers`: the read side (consumer runtime, views, run index,
  retention, the checkpoint signer).
- :mod:`agent_blackbox.replayer`: replay mode, divergence reports, run sources, fork,
  verify.
- :mod:`agent_blackbox.backup`: backups of the event log to a folder or object storage.
- :mod:`agent_blackbox.stack`, :mod:`agent_blackbox.cli`, :mod:`agent_blackbox.examples`:
  the local services, the ``blackbox`` command and the demo's agent.

Importing this package imports none of them. The names an agent needs to record every
model and tool call are here, each loaded on first use:

- :func:`instrument`: every OpenAI and Anthropic client of the process records into the
  run in force (:func:`current_run`);
- :func:`tool`: a function that records itself as a ``tool.call``;
- :func:`capture_openai`, :func:`capture_anthropic`: a recording copy of one SDK client;
- :func:`http_client`, :func:`async_http_client`: a recording ``httpx2`` client to pass
  as ``http_client=`` to any SDK or framework.
"""

import lazy_loader

# The names are listed in __init__.pyi (lazy_loader reads it); each loads on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
