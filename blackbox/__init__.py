"""agent-blackbox: a flight recorder for AI agents.

``import agent_blackbox as bb`` is all an agent needs. The names, by what they are for:

Record a run
    :class:`Recorder` (Postgres; ``Recorder.from_settings()``) and :class:`AsyncRecorder`
    for asyncio agents; :class:`RunSnapshot`, the code version and input a run starts
    from; :class:`AgentRun`, the type of the ``run`` an entry point gets (recording or
    replaying), with :class:`Run` and :class:`AsyncRun` for code that only records;
    :class:`EffectOutcome`, what a side effect's ``perform`` returns, and
    :class:`EffectRejected`, what it raises when the external system refused for sure.
Capture model and tool calls
    :func:`instrument` (every OpenAI and Anthropic client of the process records into
    the run in force, :func:`current_run`) and :func:`uninstrument`; :func:`tool`, a
    function that records itself as a ``tool.call``; :func:`capture_openai`,
    :func:`capture_anthropic`, a recording copy of one SDK client; :func:`http_client`,
    :func:`async_http_client`, a recording HTTP client to hand to any SDK or framework.
Replay a run
    :func:`replay`, one call: a recorded run (by id, found through the settings, or its
    envelopes) re-driven through the agent's own code, offline, into a
    :class:`ReplayReport` (PASS or the first divergence).
Errors
    :class:`BlackboxError`, the root of every error of the project;
    :class:`NotSerialisable`, a value a boundary cannot record.

:mod:`agent_blackbox.testing` holds what an agent's own tests use: the in-memory
recorders, replay of what they recorded, and pytest fixtures.

Every name loads its module on first use: ``import agent_blackbox`` loads nothing, and
recording loads no Kafka client, alembic, metrics library or rich. The parts behind the
door are subpackages with public surfaces of their own, for the pipeline and for
integrators: :mod:`~agent_blackbox.schemas` (the contract), :mod:`~agent_blackbox.outbox`
(the write side; its tables and ``*_txn`` functions in
:mod:`agent_blackbox.outbox.storage`), :mod:`~agent_blackbox.keystore`,
:mod:`~agent_blackbox.broker`, :mod:`~agent_blackbox.consumers` (the read side),
:mod:`~agent_blackbox.replayer` (replay, fork, verify), :mod:`~agent_blackbox.backup`,
and the ``blackbox`` command (:mod:`~agent_blackbox.cli`).
"""

import lazy_loader

# The names are listed in __init__.pyi (lazy_loader reads it); each loads on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
