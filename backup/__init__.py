"""Backups of the event log to object storage, and checking them.

:class:`BackupWriter` follows the events topic and writes cuts to a store: event
segments, a snapshot of the write side's keys, ledger, checkpoints and blobs, and a
signed, hash-chained manifest; :func:`check_store` checks a backup where it is.

The port, :class:`BackupStore`, names where backup objects live; two adapters implement
it: :class:`FolderStore` (a local folder) and :class:`S3Store` (AWS S3 or any
S3-compatible store: MinIO, S3Proxy, ...). :func:`open_store` builds one from
``BLACKBOX_BACKUP_URL``::

    from agent_blackbox.backup import open_store

    store = open_store("s3://blackbox-backups/prod?endpoint=http://127.0.0.1:29900")
    store.put("hello/world", b"...")
"""

from __future__ import annotations

from agent_blackbox.backup._chain import Chain, ChainProblem, head_manifest, load_chain
from agent_blackbox.backup._drill import DrillOptions, DrillReport, run_drill
from agent_blackbox.backup._drill_checks import Check
from agent_blackbox.backup._drill_tables import print_drill
from agent_blackbox.backup._errors import (
    BackupBusy,
    BackupCorrupt,
    BackupDiverged,
    BackupError,
    EventsLost,
)
from agent_blackbox.backup._folder import FolderStore
from agent_blackbox.backup._manifest import (
    Manifest,
    RunRange,
    SegmentEntry,
    SnapshotEntry,
    TableEntry,
)
from agent_blackbox.backup._metrics import BackupMetrics
from agent_blackbox.backup._open import open_store
from agent_blackbox.backup._outage import RetryPolicy, StoreOutageTooLong
from agent_blackbox.backup._partial import RestoreRequest, RestoreResult, restore_runs
from agent_blackbox.backup._prune import PrunePlan, plan_prune, prune
from agent_blackbox.backup._pruned import PruneRecord, load_pruned
from agent_blackbox.backup._restore import Selection
from agent_blackbox.backup._s3 import S3Store
from agent_blackbox.backup._segment import Message, decode_segment
from agent_blackbox.backup._snapshot import TABLES, SnapshotTable, blob_key, decode_table
from agent_blackbox.backup._store import (
    BACKUP_URL_ENV,
    MAX_KEY_LENGTH,
    BackupStore,
    ObjectMissing,
    StoreError,
    StoreUnreachable,
    check_key,
)
from agent_blackbox.backup._tally import EventTally
from agent_blackbox.backup._target import Target, TargetError, create_target, drop_target
from agent_blackbox.backup._trust import TRUST_CUT_OPTION, check_backup, parse_cut
from agent_blackbox.backup._verify import StoreCheck, check_store, fetch_checked
from agent_blackbox.backup._writer import BackupPolicy, BackupWriter, backup_group

__all__ = [
    "BACKUP_URL_ENV",
    "MAX_KEY_LENGTH",
    "TABLES",
    "TRUST_CUT_OPTION",
    "BackupBusy",
    "BackupCorrupt",
    "BackupDiverged",
    "BackupError",
    "BackupMetrics",
    "BackupPolicy",
    "BackupStore",
    "BackupWriter",
    "Chain",
    "ChainProblem",
    "Check",
    "DrillOptions",
    "DrillReport",
    "EventTally",
    "EventsLost",
    "FolderStore",
    "Manifest",
    "Message",
    "ObjectMissing",
    "PrunePlan",
    "PruneRecord",
    "RestoreRequest",
    "RestoreResult",
    "RetryPolicy",
    "RunRange",
    "S3Store",
    "SegmentEntry",
    "Selection",
    "SnapshotEntry",
    "SnapshotTable",
    "StoreCheck",
    "StoreError",
    "StoreOutageTooLong",
    "StoreUnreachable",
    "TableEntry",
    "Target",
    "TargetError",
    "backup_group",
    "blob_key",
    "check_backup",
    "check_key",
    "check_store",
    "create_target",
    "decode_segment",
    "decode_table",
    "drop_target",
    "fetch_checked",
    "head_manifest",
    "load_chain",
    "load_pruned",
    "open_store",
    "parse_cut",
    "plan_prune",
    "print_drill",
    "prune",
    "restore_runs",
    "run_drill",
]
