"""Example agents and the end-to-end demo."""
