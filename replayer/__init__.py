"""Offline replay: re-drive an agent's own code from a recorded run, report PASS or the
first divergence. Reads runs from Kafka (one located through a :class:`RunIndex`, which
the read side implements, or a whole history in one pass: :class:`HistoryScan`), from
Avro archives, or from envelopes in memory; nothing external is ever called. Replay mode
itself (:class:`ReplayRun`) lives here, beside its reports. Recorded runs are exported as
JSON lines (:func:`event_records`, :func:`json_line`) or as a chat dataset for
fine-tuning and evaluation (:func:`chat_examples`).

The public names are listed in ``__init__.pyi``; each is loaded from its module on first
use, so replaying runs in memory (:func:`replay_run`, :class:`ReplayReport`) loads no
Kafka client: the sources that read the topic load it when they are used.
"""

import lazy_loader

# The names are listed in __init__.pyi (lazy_loader reads it); each loads on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
