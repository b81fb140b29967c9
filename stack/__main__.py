"""``python -m agent_blackbox.stack up | down | status``."""

from agent_blackbox.stack.cli import stack_group

if __name__ == "__main__":
    stack_group(prog_name="python -m agent_blackbox.stack")
