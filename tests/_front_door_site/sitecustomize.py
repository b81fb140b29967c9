"""Loaded by the Python processes a documentation page starts while it runs with the
front door's stand-ins (tests/_front_door.py)."""

from tests._front_door import install

install()
