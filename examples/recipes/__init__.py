"""Recipes: agents written with the frameworks people use, recorded by agent-blackbox.

Each module is one framework's recipe, written as a user of that framework would write
it; its documentation is ``docs/guides/frameworks/<name>.md`` and its acceptance test
``tests/integration/frameworks/test_<name>.py``.
"""
