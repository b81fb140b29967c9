"""The read side: a consumer runtime with offsets in the database, and the first views.

Typical use, with the settings the process read once::

    migrate_views(settings.database_url)
    with ViewConsumer(settings) as consumer:
        consumer.run(stop=stop_event)

Other consumers (analytics, retention) reuse :class:`ConsumerRuntime` with their own
:data:`Projection`: a function ``(connection, records) -> BatchOutcome`` that writes
through the caller's connection and never commits.
"""

from agent_blackbox.broker import KafkaUnavailable
from agent_blackbox.consumers._analytics import (
    ANALYTICS_GROUP,
    AnalyticsConsumer,
    apply_analytics,
)
from agent_blackbox.consumers._batch import (
    AnalyticsOutcome,
    BatchOutcome,
    CallCost,
    Delivered,
    Projection,
)
from agent_blackbox.consumers._browse import (
    USAGE_GROUPS,
    Cursor,
    EffectPair,
    ListedRun,
    ReplayResult,
    RunDetail,
    RunEvent,
    RunFilter,
    RunPage,
    UsagePoint,
    list_runs_txn,
    run_detail_txn,
    run_events_txn,
    usage_series_txn,
)
from agent_blackbox.consumers._checkpoints import (
    CheckpointConsumer,
    load_checkpoint,
    sign_batch,
    sweep_heads,
)
from agent_blackbox.consumers._datasets import (
    ChosenRun,
    Dataset,
    DatasetError,
    RunSelection,
    create_dataset_txn,
    dataset_name_problem,
    dataset_txn,
    datasets_txn,
    delete_dataset_txn,
    select_runs_txn,
)
from agent_blackbox.consumers._dead_letters import (
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_REASON,
    DLQ_TOPIC,
)
from agent_blackbox.consumers._errors import (
    ConsumerError,
    DeadLetterFailed,
    MigrationFailed,
    ProjectionFailed,
    ViewsNotMigrated,
    ViewStoreUnavailable,
)
from agent_blackbox.consumers._experiments import (
    ExperimentRow,
    KeptExperiment,
    KeptResult,
    KeptScore,
    ViewExperiments,
    call_pricing,
    experiment_txn,
    experiments_txn,
    fork_experiment_txn,
)
from agent_blackbox.consumers._ledger import (
    DatabaseFacts,
    IgnoredEntry,
    LedgerEntry,
    LedgerReport,
    entries_of,
    entry_problem,
    ledger_entries,
    reapply_ledger,
)
from agent_blackbox.consumers._metrics import ConsumerMetrics, CostCounter
from agent_blackbox.consumers._migrate import migrate_views
from agent_blackbox.consumers._offsets import (
    OffsetMove,
    OffsetsMoved,
    advance_offsets,
    load_fences,
    load_offsets,
)
from agent_blackbox.consumers._prices import (
    Price,
    PriceFileError,
    PriceTable,
    TokenCounts,
    dollars_json,
    dollars_text,
)
from agent_blackbox.consumers._replay_results import ViewReplayResults
from agent_blackbox.consumers._retention import (
    Redaction,
    RetentionClass,
    RetentionConfigError,
    RetentionJob,
    RetentionPolicy,
    RetentionReport,
    shred_run_txn,
)
from agent_blackbox.consumers._run_index import IndexedRun, ViewRunIndex
from agent_blackbox.consumers._runtime import ConsumerRuntime, Screen, ViewConsumer
from agent_blackbox.consumers._signing import CheckpointPolicy, SignerFinding
from agent_blackbox.consumers._snapshot import checkpoint_rows_txn, restore_checkpoints_txn
from agent_blackbox.consumers._stats import GROUPINGS, UsageRow, llm_usage_txn
from agent_blackbox.consumers._summary import (
    RunRow,
    ViewsSummary,
    event_references_txn,
    event_spans_txn,
    indexed_events_txn,
    view_digests_txn,
    views_summary_txn,
)
from agent_blackbox.consumers._tables import (
    VIEWS_SCHEMA,
    consumer_offsets,
    effect_calls,
    events_index,
    integrity_violations,
    llm_calls,
    run_rollups,
    runs_view,
    tool_calls,
)
from agent_blackbox.consumers._view_metrics import (
    RetentionGauges,
    ViewFigures,
    ViewGauges,
    refresh_view_gauges,
    view_figures_txn,
)
from agent_blackbox.consumers._views import apply_batch, views_screen

__all__ = [
    "ANALYTICS_GROUP",
    "DLQ_OFFSET",
    "DLQ_PARTITION",
    "DLQ_REASON",
    "DLQ_TOPIC",
    "GROUPINGS",
    "USAGE_GROUPS",
    "VIEWS_SCHEMA",
    "AnalyticsConsumer",
    "AnalyticsOutcome",
    "BatchOutcome",
    "CallCost",
    "CheckpointConsumer",
    "CheckpointPolicy",
    "ChosenRun",
    "ConsumerError",
    "ConsumerMetrics",
    "ConsumerRuntime",
    "CostCounter",
    "Cursor",
    "DatabaseFacts",
    "Dataset",
    "DatasetError",
    "DeadLetterFailed",
    "Delivered",
    "EffectPair",
    "ExperimentRow",
    "IgnoredEntry",
    "IndexedRun",
    "KafkaUnavailable",
    "KeptExperiment",
    "KeptResult",
    "KeptScore",
    "LedgerEntry",
    "LedgerReport",
    "ListedRun",
    "MigrationFailed",
    "OffsetMove",
    "OffsetsMoved",
    "Price",
    "PriceFileError",
    "PriceTable",
    "Projection",
    "ProjectionFailed",
    "Redaction",
    "ReplayResult",
    "RetentionClass",
    "RetentionConfigError",
    "RetentionGauges",
    "RetentionJob",
    "RetentionPolicy",
    "RetentionReport",
    "RunDetail",
    "RunEvent",
    "RunFilter",
    "RunPage",
    "RunRow",
    "RunSelection",
    "Screen",
    "SignerFinding",
    "TokenCounts",
    "UsagePoint",
    "UsageRow",
    "ViewConsumer",
    "ViewExperiments",
    "ViewFigures",
    "ViewGauges",
    "ViewReplayResults",
    "ViewRunIndex",
    "ViewStoreUnavailable",
    "ViewsNotMigrated",
    "ViewsSummary",
    "advance_offsets",
    "apply_analytics",
    "apply_batch",
    "call_pricing",
    "checkpoint_rows_txn",
    "consumer_offsets",
    "create_dataset_txn",
    "dataset_name_problem",
    "dataset_txn",
    "datasets_txn",
    "delete_dataset_txn",
    "dollars_json",
    "dollars_text",
    "effect_calls",
    "entries_of",
    "entry_problem",
    "event_references_txn",
    "event_spans_txn",
    "events_index",
    "experiment_txn",
    "experiments_txn",
    "fork_experiment_txn",
    "indexed_events_txn",
    "integrity_violations",
    "ledger_entries",
    "list_runs_txn",
    "llm_calls",
    "llm_usage_txn",
    "load_checkpoint",
    "load_fences",
    "load_offsets",
    "migrate_views",
    "reapply_ledger",
    "refresh_view_gauges",
    "restore_checkpoints_txn",
    "run_detail_txn",
    "run_events_txn",
    "run_rollups",
    "runs_view",
    "select_runs_txn",
    "shred_run_txn",
    "sign_batch",
    "sweep_heads",
    "tool_calls",
    "usage_series_txn",
    "view_digests_txn",
    "view_figures_txn",
    "views_screen",
    "views_summary_txn",
]
