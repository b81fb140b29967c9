"""``python -m agent_blackbox``: the ``blackbox`` command."""

from agent_blackbox.cli import main

main()
