"""The ``blackbox`` command line: one entry point composing every part's commands."""

from agent_blackbox.cli.main import main

__all__ = ["main"]
