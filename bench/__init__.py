"""Benchmarks of the recorder, the relay and the view consumer against real services.

``python -m bench`` runs them all; each module also runs on its own
(``python bench/relay.py``). See ``bench/_common.py`` for the output format.
"""
