"""What the fault tests that run ``blackbox backup run`` check of its store, and the
object-store outage scenario of the soak.

A backup is read back the way a restore would read it: the signed manifest chain
(:func:`agent_blackbox.backup.check_store`) and the segments it names, decoded with the
envelope codec. Nothing here goes through the writer that wrote them.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import boto3
from botocore.config import Config
from sqlalchemy import text

from agent_blackbox.backup import BackupStore, S3Store, check_store, decode_segment
from agent_blackbox.backup._cut import EVENTS
from agent_blackbox.broker import ensure_topics, watermarks
from agent_blackbox.schemas import EnvelopeCodec, Settings
from agent_blackbox.stack import LocalS3
from tests.faults._check import Figures
from tests.faults._harness import FaultStack, Load, Scenario, Worker, eventually
from tests.faults._scenarios import _loaded, _run
from tests.integration._backups import SIGNER, VERIFIER


def backed_up_to_the_end(settings: Settings, store: BackupStore) -> bool:
    """Whether the newest cut's positions are the topic's end offsets."""
    ends = {p: high for p, (_low, high) in watermarks(settings, settings.topic).items()}
    check = check_store(store, VERIFIER)
    return check.cut is not None and dict(check.cut.positions) == ends


def backup_problems(settings: Settings, store: BackupStore) -> list[str]:
    """What is wrong with the backup of ``settings.topic`` in ``store``, in words: a
    chain that does not check, a segment object no manifest names (written twice under
    another key), or a partition whose segments overlap or leave a gap between the
    topic's start and its end."""
    check = check_store(store, VERIFIER)
    if not check.passed:
        return [f"the backup's chain does not check: {check.problems}"]
    named = {s.key for s in check.segments_held()}
    found = [f"segment {key} named by no manifest" for key in set(store.keys(EVENTS)) - named]
    ends = {p: high for p, (_low, high) in watermarks(settings, settings.topic).items()}
    for partition, end in ends.items():
        spans = sorted(
            (s.first_offset, s.last_offset)
            for s in check.segments_held()
            if s.partition == partition
        )
        covered = 0
        for first, last in spans:
            if first != covered:
                found.append(f"partition {partition}: segments {spans} overlap or leave a gap")
                break
            covered = last + 1
        else:
            if covered != end:
                found.append(f"partition {partition}: backed up to {covered}, the topic to {end}")
    return found


def assert_each_event_once(settings: Settings, store: BackupStore) -> None:
    """Per partition, the chain's segments cover the topic from its start to its end
    with no overlap and no gap, and the store holds no segment no manifest names."""
    problems = backup_problems(settings, store)
    assert not problems, problems


def backed_up_events(store: BackupStore) -> set[tuple[str, int, str]]:
    """(run, sequence, event id) of every event the chain's segments hold."""
    codec = EnvelopeCodec()
    found: set[tuple[str, int, str]] = set()
    for segment in check_store(store, VERIFIER).segments_held():
        for message in decode_segment(store.get(segment.key), key=segment.key):
            envelope = codec.decode(message.value or b"")
            found.add((envelope.run_id, envelope.sequence, str(envelope.event_id)))
    return found


def manifests(store: BackupStore) -> int:
    """How many manifests (cuts) the store holds."""
    return len(list(store.keys("manifests/")))


OUTAGE_S = 15.0
"""How long the object store stays away, each round (the issue's 15 s)."""


def store_outage(stack: FaultStack, log_dir: Path, events: int, *, s3: LocalS3) -> Figures:
    """A ``blackbox backup run`` follows the topic under load while its object store
    (``s3``, which this scenario kills and starts again) is away for :data:`OUTAGE_S`
    each round. Afterwards the backup reaches the topic's end without having been
    restarted, each event in exactly one segment, every committed event in it; the time
    from the store's return to the next cut written is the recovery figure."""

    def body(current: Scenario, figures: Figures, events: int) -> None:
        store, env = _backup_store(s3, log_dir, current.name)
        ensure_topics(current.settings)  # the backup needs the topic at its start
        backup = current._spawn("backup", ["backup", "run", "--roll-seconds", "1"], env=env)

        def fault(number: int, load: Load) -> None:
            eventually(lambda: _cutting(backup, store), timeout=120, what="the backup cutting")
            s3.kill()
            until, written = time.monotonic() + OUTAGE_S, load.events
            eventually(
                lambda: time.monotonic() >= until and load.events > written,
                timeout=OUTAGE_S + 60,
                what="writers going on while the store is away",
                interval=0.5,
            )
            cuts = manifests_when_up(s3, store)
            back = time.monotonic()
            eventually(
                lambda: _cutting(backup, store) and manifests(store) > cuts,
                timeout=120,
                what=f"a cut written after the outage (see {backup.log})",
            )
            figures.takeovers_s.append(time.monotonic() - back)

        _loaded(current, figures, events, fault)
        eventually(lambda: current.outbox_rows() == 0, timeout=180, what="outbox drained")
        eventually(
            lambda: _cutting(backup, store) and backed_up_to_the_end(current.settings, store),
            timeout=180,
            what=f"the backup reaching the topic's end (see {backup.log})",
        )
        figures.broken.extend(backup_problems(current.settings, store))
        figures.broken.extend(_not_backed_up(current, store))
        figures.notes.update(cuts=manifests(store), outage_s=OUTAGE_S)
        if (code := backup.terminate(timeout=60)) != 0:
            figures.broken.append(f"the backup exited {code}: see {backup.log}")

    return _run(stack, log_dir, "store_outage", events, body)


def manifests_when_up(s3: LocalS3, store: BackupStore) -> int:
    """Start the store again; the manifests it holds once it answers."""
    s3.start()
    return manifests(store)


def _backup_store(s3: LocalS3, log_dir: Path, name: str) -> tuple[BackupStore, dict[str, str]]:
    """A fresh prefix of ``s3``, and the environment a ``backup run`` writes to it with."""
    endpoint = s3.start()  # already running: only says where and with what
    prefix = f"{name}-{uuid.uuid4().hex[:10]}"
    key = log_dir / f"{prefix}.pem"
    key.write_bytes(SIGNER.private_key_pem())
    key.chmod(0o600)
    env = {
        "AWS_ACCESS_KEY_ID": endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_key,
        "BLACKBOX_BACKUP_URL": f"s3://{endpoint.bucket}/{prefix}?endpoint={endpoint.endpoint_url}",
        "BLACKBOX_SIGNING_KEY_FILE": str(key),
    }
    # As the project's own client talks to an S3-compatible store: path-style, and no
    # checksum headers S3Proxy does not implement.
    config = Config(
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint.endpoint_url,
        aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key,
        region_name="us-east-1",
        config=config,
    )
    store = S3Store(endpoint.bucket, prefix=prefix, endpoint=endpoint.endpoint_url, client=client)
    return store, env


def _cutting(backup: Worker, store: BackupStore) -> bool:
    """Whether the backup wrote a cut; fails at once, naming its log, when it exited."""
    assert backup.process.poll() is None, f"the backup exited: see {backup.log}"
    return manifests(store) > 0


def _not_backed_up(current: Scenario, store: BackupStore) -> list[str]:
    """Committed events (the outbox trigger's copy) the backup does not hold."""
    with current.engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, sequence FROM public.fault_committed")).all()
    held = {(run, seq) for run, seq, _ in backed_up_events(store)}
    missing = {(str(r[0]), int(r[1])) for r in rows} - held
    return [f"{len(missing)} committed events not in the backup"] if missing else []
