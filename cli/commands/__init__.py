"""The ``blackbox`` commands, a module per topic; :mod:`agent_blackbox.cli.main` composes
them into one group. Each command takes its settings and engines from the invocation's
:class:`~agent_blackbox.cli._wiring.Wiring` and hands them down to the parts."""
