"""Offline replay, divergence reports, fork and re-execution, backup and restore drills.

Nothing here yet: the replay mode of the Recorder and the replayer land with the replay
issue. The package exists so the read paths it will own (Kafka via the events index,
archives, in-memory envelopes) have their home from the start.
"""

__all__: list[str] = []
