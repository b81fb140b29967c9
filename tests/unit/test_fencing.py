"""The epoch fence: a stale relay's copy is dropped only after a newer epoch in its partition."""

from __future__ import annotations

from agent_blackbox.broker import LEASE_HEADER, EpochFence, GrantedEpochs, LeaseStamp, read_stamp


def stamped(shard: int, epoch: int) -> list[tuple[str, bytes | str | None]]:
    return [("blackbox.event_id", b"e"), LeaseStamp(shard, epoch).header()]


def test_an_older_epoch_after_a_newer_one_in_the_same_partition_is_dropped() -> None:
    fence = EpochFence()
    assert fence.admit(0, stamped(3, 5))
    assert fence.admit(0, stamped(3, 6))
    assert fence.admit(0, stamped(3, 6))
    assert not fence.admit(0, stamped(3, 5))
    assert fence.dropped == 1


def test_partitions_and_shards_are_judged_apart() -> None:
    fence = EpochFence()
    assert fence.admit(0, stamped(3, 6))
    # Published before the takeover, read later because partition 1 lags: still admitted.
    assert fence.admit(1, stamped(3, 5))
    assert fence.admit(0, stamped(4, 1))
    assert fence.dropped == 0


def test_unstamped_and_malformed_messages_are_not_fenced() -> None:
    fence = EpochFence()
    assert fence.admit(0, stamped(3, 9))
    assert fence.admit(0, None)
    assert fence.admit(0, [(LEASE_HEADER, b"3:")])
    assert fence.admit(0, [(LEASE_HEADER, b"x:1")])
    assert read_stamp([(LEASE_HEADER, "7:2")]) == LeaseStamp(7, 2)
    assert read_stamp([(LEASE_HEADER, None)]) is None


def test_state_round_trips_and_forget_clears_a_partition() -> None:
    fence = EpochFence()
    fence.admit(2, stamped(1, 4))
    fence.admit(2, stamped(5, 7))
    saved = fence.state(2)
    assert saved == {1: 4, 5: 7}
    fence.forget([2])
    assert fence.admit(2, stamped(5, 6))
    resumed = EpochFence()
    resumed.restore(2, saved)
    assert not resumed.admit(2, stamped(5, 6))


def test_a_header_longer_than_any_stamp_is_malformed_and_not_remembered() -> None:
    from agent_blackbox.broker import _fencing

    before = _fencing._remembered_stamp.cache_info().currsize
    hostile = b"1" * 100_000 + b":2"
    assert read_stamp([("blackbox.lease", hostile)]) is None  # no ValueError from int()
    assert _fencing._remembered_stamp.cache_info().currsize == before
    assert read_stamp([("blackbox.lease", b"5:9")]) == LeaseStamp(5, 9)
    assert _fencing._remembered_stamp.cache_info().currsize == before + 1


def test_a_fence_moves_only_to_an_epoch_the_write_side_granted() -> None:
    granted = {3: 6}
    asked: list[int] = []

    def lookup() -> dict[int, int]:
        asked.append(1)
        return dict(granted)

    fence = EpochFence(GrantedEpochs(lookup, every_s=0.0))
    assert fence.admit(0, stamped(3, 5))
    assert fence.admit(0, stamped(3, 999_999))  # forged: read as unstamped, moves nothing
    assert (fence.unproven, fence.state(0)) == (1, {3: 5})
    assert fence.admit(0, stamped(3, 6))  # the relay that took the shard over
    assert not fence.admit(0, stamped(3, 5))  # a stale copy is still dropped
    assert fence.dropped == 1
    granted[3] = 7
    assert fence.admit(0, stamped(3, 7))
    assert fence.state(0) == {3: 7}
    assert len(asked) == 3  # only when a stamp claims an epoch past those known


def test_a_stored_forged_epoch_is_forgotten_on_restore() -> None:
    fence = EpochFence(GrantedEpochs(lambda: {3: 6}))
    fence.restore(0, {3: 999_999, 4: 2})
    assert fence.state(0) == {3: 6, 4: -1}
    assert fence.admit(0, stamped(3, 6))


def test_without_a_write_side_to_ask_stamps_are_taken_at_their_word() -> None:
    fence = EpochFence(GrantedEpochs(lambda: None))
    assert fence.admit(0, stamped(3, 999_999))
    assert not fence.admit(0, stamped(3, 5))


def test_a_write_side_that_cannot_answer_moves_no_fence() -> None:
    def down() -> dict[int, int]:
        raise ConnectionError("the database is down")

    fence = EpochFence(GrantedEpochs(down, every_s=0.0))
    assert fence.admit(0, stamped(3, 5))
    assert fence.admit(0, stamped(3, 4))
    assert (fence.dropped, fence.unproven, fence.state(0)) == (0, 2, {})
