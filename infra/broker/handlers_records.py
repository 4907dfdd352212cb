"""Handlers for the record path: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, InitProducerId,
and the transaction APIs (refused: transactions are out of scope).

Produce appends each partition's record batches to its `PartitionLog` (the log validates CRCs and
idempotent sequences and assigns offsets) and wakes waiting fetches. Fetch long-polls until
`min_bytes` are available or `max_wait_ms` passes, returning whole batches within `max_bytes` and
`partition_max_bytes` (the first batch always, as Kafka does, so a large batch never blocks a
consumer). A stored batch whose CRC-32C no longer verifies is never served: its partition is answered
with CORRUPT_MESSAGE (2), which kafka-python raises from `poll()` and aiokafka logs at WARNING at each
retry, one per max_wait_ms (KAFKA_STORAGE_ERROR, 56, would make kafka-python retry silently forever).
Transactions are answered with TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), which kafka-python and
aiokafka raise as a fatal, clearly named error instead of retrying.
"""

from __future__ import annotations

import logging
import time

from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse, OffsetForLeaderEpochResponse
from kafka.protocol.producer import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    ProduceResponse,
    TxnOffsetCommitResponse,
)

from infra.broker import errors
from infra.broker.protocol import ErrorCode, Request
from infra.broker.state import BrokerState

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
NO_TRANSACTIONS = "transactions are not supported by the embedded broker (transactional_id={!r})"

# order matters: subclasses first
APPEND_ERRORS: tuple[tuple[type[Exception], int], ...] = (
    (errors.RecordTooLargeError, ErrorCode.MESSAGE_TOO_LARGE),
    (errors.CorruptRecordError, ErrorCode.CORRUPT_MESSAGE),
    (errors.InvalidRecordError, ErrorCode.INVALID_RECORD),
    (errors.OutOfOrderSequenceError, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (errors.InvalidProducerEpochError, ErrorCode.INVALID_PRODUCER_EPOCH),
    (errors.UnknownTopicError, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (errors.StorageIOError, ErrorCode.KAFKA_STORAGE_ERROR),
)


def append_error_code(exc: Exception) -> int:
    for exc_type, code in APPEND_ERRORS:
        if isinstance(exc, exc_type):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR


# -- Produce -------------------------------------------------------------------------------------


async def handle_produce(state: BrokerState, req: Request):
    body = req.body
    refusal = _produce_refusal(body)
    appended: dict[int, object] = {}  # id(log) -> log that received records
    topics = [_produce_topic(state, topic, refusal, appended) for topic in body.topic_data]
    logs, arrived = list(appended.values()), _arrived(body)
    if body.acks == 0:
        _make_durable_later(state, logs, arrived)
        return None  # aiokafka and kafka-python do not read a response for acks=0
    if logs and state.acks_wait_for_fsync:
        try:
            await state.commit.durable(logs, sum(arrived.values()))
        except Exception as exc:  # nothing acknowledged that is not on disk
            log.error("produce not acknowledged, fsync failed: %s", exc)
            topics = [_storage_failed(topic, str(exc)) for topic in topics]
    state.appended.notify(arrived)
    return ProduceResponse(version=req.api_version, throttle_time_ms=0, responses=topics)


def _make_durable_later(state: BrokerState, logs: list, arrived: dict[tuple[str, int], int]) -> None:
    if logs and state.acks_wait_for_fsync:
        state.commit.schedule(logs, sum(arrived.values()))
    state.appended.notify(arrived)


def _arrived(body) -> dict[tuple[str, int], int]:
    """(topic, partition) -> bytes of the produce request's records (what waiting fetches count)."""
    return {
        (topic.name, data.index): len(data.records)
        for topic in body.topic_data
        for data in topic.partition_data
        if data.records
    }


def _storage_failed(topic, message: str):
    for partition in topic.partition_responses:
        if partition.error_code == ErrorCode.NONE:
            partition.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            partition.base_offset = -1
            partition.error_message = f"fsync failed: {message}"
    return topic


def _produce_refusal(body) -> tuple[int, str] | None:
    if body.transactional_id is not None:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_TRANSACTIONS.format(body.transactional_id)
    if body.acks not in (-1, 0, 1):
        return ErrorCode.INVALID_REQUIRED_ACKS, f"acks={body.acks} (expected -1, 0 or 1)"
    return None


def _produce_topic(state: BrokerState, topic, refusal: tuple[int, str] | None, appended: dict):
    topic_class = ProduceResponse.TopicProduceResponse
    partitions = [
        _produce_partition(state, topic.name, data, refusal, appended) for data in topic.partition_data
    ]
    return topic_class(name=topic.name, partition_responses=partitions)


def _produce_partition(state: BrokerState, topic: str, data, refusal: tuple[int, str] | None, appended: dict):
    partition_class = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
    if refusal is not None:
        return _produce_error(partition_class, data.index, *refusal)
    try:
        partition_log = state.store.log(topic, data.index)
        result = partition_log.append(data.records or b"")
        durable_by = _write_ahead(state, partition_log, topic, data, result)
    except errors.BrokerStorageError as exc:
        code = append_error_code(exc)
        log.warning("produce to %s[%d] refused (%s): %s", topic, data.index, ErrorCode(code).name, exc)
        return _produce_error(partition_class, data.index, code, str(exc))
    appended[id(durable_by)] = durable_by
    return partition_class(
        index=data.index,
        error_code=0,  # a duplicate (retried) batch is acknowledged with its original offsets
        base_offset=result.base_offset,
        log_append_time_ms=result.log_append_time_ms,
        log_start_offset=partition_log.log_start_offset,
        record_errors=[],
        error_message=None,
    )


def _write_ahead(state: BrokerState, partition_log, topic: str, data, result):
    """What the group commit must flush for this append to be durable: the write-ahead file, with a
    frame of the records appended to it (infra/broker/wal.py), or without one the partition log."""
    wal = state.store.write_ahead
    if wal is None:
        return partition_log
    if not result.duplicate:  # a retried batch was framed when first appended
        try:
            wal.append(
                partition_log, state.store.topic(topic).topic_id, data.index, result.base_offset, data.records
            )
        except OSError as exc:
            raise errors.StorageIOError(f"write-ahead of {topic}[{data.index}] failed: {exc}") from exc
    return wal


def _produce_error(partition_class, index: int, code: int, message: str):
    return partition_class(
        index=index,
        error_code=code,
        base_offset=-1,
        log_append_time_ms=-1,
        log_start_offset=-1,
        record_errors=[],
        error_message=message,
    )


# -- Fetch ---------------------------------------------------------------------------------------


async def handle_fetch(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    deadline = time.monotonic() + max(body.max_wait_ms, 0) / 1000
    min_bytes = max(body.min_bytes, 1)
    topics, total, failed = _read_fetch(state, body, version)
    remaining = deadline - time.monotonic()
    if total < min_bytes and not failed and remaining > 0:
        # read again once the bytes still missing were appended to these partitions, or at the deadline
        partitions = [(t.topic, p.partition) for t in body.topics for p in t.partitions]
        await state.appended.wait(partitions, min_bytes - total, remaining)
        topics, total, failed = _read_fetch(state, body, version)
    # session_id=0: no incremental fetch session (KIP-227); every client then sends full fetches
    return FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=0, responses=topics)


# a damaged batch does not end the long poll: aiokafka retries it at once, 5,000 fetches in 3 s
# otherwise; this way once per max_wait_ms (or when the partition receives data)
_WAITABLE = (ErrorCode.NONE, ErrorCode.CORRUPT_MESSAGE)


def _read_fetch(state: BrokerState, body, version: int) -> tuple[list, int, bool]:
    budget = body.max_bytes if version >= 3 else 2**31 - 1
    topics, total, failed = [], 0, False
    for topic in body.topics:
        partitions = []
        for request in topic.partitions:
            partition, size = _read_partition(state, topic.topic, request, budget - total, total == 0)
            failed = failed or partition.error_code not in _WAITABLE
            total += size
            partitions.append(partition)
        topics.append(FetchResponse.FetchableTopicResponse(topic=topic.topic, partitions=partitions))
    return topics, total, failed


def _read_partition(state: BrokerState, topic: str, request, budget: int, first: bool):
    """One partition's data: (PartitionData, bytes returned)."""
    try:
        partition_log = state.store.log(topic, request.partition)
    except errors.BrokerStorageError:
        return _fetch_partition(request.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1), 0
    start, end = partition_log.log_start_offset, partition_log.high_watermark
    offset = request.fetch_offset
    if offset < start or offset > end:
        return _fetch_partition(request.partition, ErrorCode.OFFSET_OUT_OF_RANGE, end, start), 0
    data = b""
    if offset < end and (budget > 0 or first):
        try:
            data = partition_log.read(offset, max(min(request.partition_max_bytes, budget), 1))
        except errors.OffsetOutOfRangeError:
            return _fetch_partition(request.partition, ErrorCode.OFFSET_OUT_OF_RANGE, end, start), 0
        except errors.StoredBatchCorruptError:  # logged by the log at ERROR; its bytes never leave
            return _fetch_partition(request.partition, ErrorCode.CORRUPT_MESSAGE, end, start), 0
        if len(data) > budget and not first:
            data = b""  # only the response's first batch may exceed the budget
    return _fetch_partition(request.partition, ErrorCode.NONE, end, start, data), len(data)


def _fetch_partition(index: int, code: int, high_watermark: int, log_start: int, records=b""):
    return FetchResponse.FetchableTopicResponse.PartitionData(
        partition_index=index,
        error_code=code,
        high_watermark=high_watermark,
        last_stable_offset=high_watermark,  # no transactions: everything below the HW is stable
        log_start_offset=log_start,
        aborted_transactions=[],
        preferred_read_replica=-1,
        records=records,
    )


# -- ListOffsets / OffsetForLeaderEpoch ----------------------------------------------------------


async def handle_list_offsets(state: BrokerState, req: Request):
    topic_class = ListOffsetsResponse.ListOffsetsTopicResponse
    topics = [
        topic_class(
            name=topic.name, partitions=[_list_offset(state, topic.name, p) for p in topic.partitions]
        )
        for topic in req.body.topics
    ]
    return ListOffsetsResponse(version=req.api_version, throttle_time_ms=0, topics=topics)


def _list_offset(state: BrokerState, topic: str, request):
    partition_class = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse
    index = request.partition_index
    try:
        partition_log = state.store.log(topic, index)
    except errors.BrokerStorageError:
        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return partition_class(partition_index=index, error_code=code, timestamp=-1, offset=-1)
    offset, timestamp, code = _resolve_offset(partition_log, request.timestamp)
    return partition_class(
        partition_index=index,
        error_code=code,
        old_style_offsets=[offset] if offset >= 0 else [],
        timestamp=timestamp,
        offset=offset,
        leader_epoch=0,
    )


def _resolve_offset(partition_log, timestamp: int) -> tuple[int, int, int]:
    """(offset, timestamp, error code) for a ListOffsets timestamp query."""
    if timestamp == EARLIEST:
        return partition_log.log_start_offset, -1, ErrorCode.NONE
    if timestamp == LATEST:
        return partition_log.high_watermark, -1, ErrorCode.NONE
    if timestamp < 0:
        return -1, -1, ErrorCode.INVALID_REQUEST  # MAX_TIMESTAMP (-3) and others: not served
    found = partition_log.offset_for_timestamp(timestamp)
    if found is None:
        return -1, -1, ErrorCode.NONE  # no record at or after the timestamp, as Kafka answers
    return found[0], found[1], ErrorCode.NONE


async def handle_offset_for_leader_epoch(state: BrokerState, req: Request):
    result_class = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
    topics = [
        result_class(
            topic=topic.topic, partitions=[_epoch_end(state, topic.topic, p) for p in topic.partitions]
        )
        for topic in req.body.topics
    ]
    return OffsetForLeaderEpochResponse(version=req.api_version, throttle_time_ms=0, topics=topics)


def _epoch_end(state: BrokerState, topic: str, request):
    epoch_class = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult.EpochEndOffset
    try:
        end = state.store.log(topic, request.partition).high_watermark
    except errors.BrokerStorageError:
        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return epoch_class(error_code=code, partition=request.partition, leader_epoch=-1, end_offset=-1)
    # a single leader epoch (0) ever: its end offset is the high watermark
    return epoch_class(error_code=0, partition=request.partition, leader_epoch=0, end_offset=end)


# -- InitProducerId and transactions -------------------------------------------------------------

MAX_EPOCH = 32767


async def handle_init_producer_id(state: BrokerState, req: Request):
    body, version = req.body, req.api_version
    if body.transactional_id is not None:
        log.warning("refused InitProducerId: %s", NO_TRANSACTIONS.format(body.transactional_id))
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return InitProducerIdResponse(
            version=version, throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1
        )
    producer_id, epoch = _producer_identity(state, body, version)
    return InitProducerIdResponse(
        version=version, throttle_time_ms=0, error_code=0, producer_id=producer_id, producer_epoch=epoch
    )


def _producer_identity(state: BrokerState, body, version: int) -> tuple[int, int]:
    """A fresh durable id, or (KIP-360) the same id with its epoch bumped."""
    if version >= 3 and body.producer_id >= 0 and 0 <= body.producer_epoch < MAX_EPOCH - 1:
        return body.producer_id, body.producer_epoch + 1
    return state.store.next_producer_id(), 0


async def handle_add_partitions_to_txn(state: BrokerState, req: Request):
    response = AddPartitionsToTxnResponse
    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if req.api_version >= 4:
        return response(
            version=req.api_version, throttle_time_ms=0, error_code=code, results_by_transaction=[]
        )
    topic_class = response.AddPartitionsToTxnTopicResult
    partition_class = topic_class.AddPartitionsToTxnPartitionResult
    results = [
        topic_class(
            name=t.name,
            results_by_partition=[
                partition_class(partition_index=p, partition_error_code=code) for p in t.partitions
            ],
        )
        for t in req.body.v3_and_below_topics
    ]
    return response(version=req.api_version, throttle_time_ms=0, results_by_topic_v3_and_below=results)


async def handle_add_offsets_to_txn(state: BrokerState, req: Request):
    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return AddOffsetsToTxnResponse(version=req.api_version, throttle_time_ms=0, error_code=code)


async def handle_end_txn(state: BrokerState, req: Request):
    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return EndTxnResponse(version=req.api_version, throttle_time_ms=0, error_code=code)


async def handle_txn_offset_commit(state: BrokerState, req: Request):
    code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    topic_class = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    partition_class = topic_class.TxnOffsetCommitResponsePartition
    topics = [
        topic_class(
            name=t.name,
            partitions=[
                partition_class(partition_index=p.partition_index, error_code=code) for p in t.partitions
            ],
        )
        for t in req.body.topics
    ]
    return TxnOffsetCommitResponse(version=req.api_version, throttle_time_ms=0, topics=topics)
