"""Recipes: agents built on the frameworks people use, recorded by agent-blackbox.

Each module is the agent code of one recipe, written as a user of its framework writes
it; ``docs/recipes/<name>.md`` tells the wiring and what is recorded, and
``tests/integration/frameworks/`` records and replays it on the real stack.
"""
