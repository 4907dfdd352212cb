"""Wire-level behaviour of the embedded broker on raw sockets (issue 3).

Garbage, truncated and oversized frames close only the offending connection; unsupported API
versions get Kafka's documented answers; a retried idempotent batch is acknowledged once; corrupt
and out-of-order batches get their Kafka error codes.
"""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer import FetchRequest, HeartbeatRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from tests.support.broker import start_broker
from tests.support.raw_client import RawClient, record_batch

pytestmark = pytest.mark.integration

MAX_REQUEST_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def small_frames_broker(tmp_path_factory):
    """A broker with a small max request size, so oversized frames are cheap to send."""
    handle = start_broker(
        tmp_path_factory.mktemp("wire-broker"), extra_args=["--max-request-bytes", str(MAX_REQUEST_BYTES)]
    )
    yield handle
    handle.stop()


def send_and_drain(bootstrap: str, data: bytes) -> None:
    """Send `data`, then read until the broker answers or closes (never waits more than 2 s)."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass


frames = st.one_of(
    st.binary(max_size=300),  # no framing at all
    st.binary(max_size=300).map(lambda b: struct.pack(">i", len(b)) + b),  # framed garbage
    st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=64)).map(
        lambda t: struct.pack(">i", t[0]) + t[1]  # any size prefix, truncated body
    ),
    st.tuples(
        st.sampled_from([0, 1, 3, 8, 11, 18, 19, 20, 32]), st.integers(0, 20), st.binary(max_size=200)
    ).map(
        lambda t: _framed(struct.pack(">hhi", t[0], t[1], 7) + t[2])  # a real api key, broken body
    ),
)


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=frames)
def test_garbage_frames_never_break_the_broker(small_frames_broker, data):
    send_and_drain(small_frames_broker.bootstrap, data)
    with RawClient(small_frames_broker.bootstrap) as client:
        assert client.api_versions_ok()


def test_oversized_and_truncated_frames_close_only_their_connection(small_frames_broker):
    bootstrap = small_frames_broker.bootstrap
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send("wire-survivor", b"before").get(timeout=10)

    with RawClient(bootstrap) as oversized:
        oversized.send_bytes(struct.pack(">i", MAX_REQUEST_BYTES + 1) + b"\0" * 1024)
        assert oversized.read_frame() is None, "an oversized frame closes the connection"
    with RawClient(bootstrap) as truncated:
        truncated.send_bytes(struct.pack(">i", 100) + b"\0" * 10)
    with RawClient(bootstrap) as unknown_api:
        unknown_api.send_bytes(_framed(struct.pack(">hhi", 999, 0, 1) + b"\0\0"))
        assert unknown_api.read_frame() is None, "an unknown api key closes the connection"

    producer.send("wire-survivor", b"after").get(timeout=10)  # the old connection still works
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    consumer.assign([TopicPartition("wire-survivor", 0)])
    assert [r.value for r in consumer] == [b"before", b"after"]
    consumer.close()
    assert "frame size" in small_frames_broker.proc.log_text(), "the close is logged"


def test_unsupported_versions_get_kafkas_answers(small_frames_broker):
    with RawClient(small_frames_broker.bootstrap) as client:
        request = ApiVersionsRequest(version=4, client_software_name="t", client_software_version="1")
        response = client.request(request, ApiVersionsResponse)
        assert response.error_code == 35, "KIP-511: UNSUPPORTED_VERSION with a v0 body"
        advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert advertised[18] == (0, 3)
        assert advertised[1] == (4, 12)

        heartbeat = HeartbeatRequest(group_id="g", generation_id=1, member_id="m", version=0)
        assert client.request(heartbeat).error_code == 25, "known version still answered"
    with RawClient(small_frames_broker.bootstrap) as client:
        fetch = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, topics=[], version=13)
        assert client.request(fetch).error_code == 35, "top-level error code: UNSUPPORTED_VERSION"
    with RawClient(small_frames_broker.bootstrap) as client, pytest.raises(ConnectionError):
        # no top-level error code in ListOffsets: the connection is closed, as Kafka does
        client.request(ListOffsetsRequest(replica_id=-1, topics=[], version=9))
    with RawClient(small_frames_broker.bootstrap) as client:
        assert client.api_versions_ok()


def produce_request(topic: str, batch: bytes) -> ProduceRequest:
    partition = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[partition])
    return ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[data], version=9)


def produce_result(client: RawClient, topic: str, batch: bytes) -> tuple[int, int]:
    response = client.request(produce_request(topic, batch))
    partition = response.responses[0].partition_responses[0]
    return partition.error_code, partition.base_offset


def latest_offset(client: RawClient, topic: str) -> int:
    partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=-1
    )
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[partition])],
        version=5,
    )
    return client.request(request).topics[0].partitions[0].offset


def test_retried_idempotent_batch_is_acknowledged_without_duplication(small_frames_broker):
    bootstrap, topic = small_frames_broker.bootstrap, "idempotent"
    KafkaProducer(bootstrap_servers=bootstrap).send(topic, b"create").get(timeout=10)  # auto-create
    with RawClient(bootstrap) as client:
        init = client.request(
            InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1, version=1)
        )
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        first = record_batch([b"a", b"b", b"c"], pid, epoch, base_sequence=0)

        assert produce_result(client, topic, first) == (0, 1)
        assert produce_result(client, topic, first) == (0, 1), "the retry gets the original offset"
        assert latest_offset(client, topic) == 4, "and is not appended twice"

        gap = record_batch([b"x"], pid, epoch, base_sequence=7)
        assert produce_result(client, topic, gap)[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        stale = record_batch([b"y"], pid, epoch - 1 if epoch > 0 else -2, base_sequence=3)
        assert produce_result(client, topic, stale)[0] in (45, 47)

        corrupt = bytearray(record_batch([b"z"], pid, epoch, base_sequence=3))
        corrupt[-1] ^= 0xFF
        assert produce_result(client, topic, bytes(corrupt))[0] == 2  # CORRUPT_MESSAGE

        following = record_batch([b"d"], pid, epoch, base_sequence=3)
        assert produce_result(client, topic, following) == (0, 4)
        assert latest_offset(client, topic) == 5


def test_new_producer_ids_are_distinct(small_frames_broker):
    with RawClient(small_frames_broker.bootstrap) as client:
        ids = {
            client.request(
                InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1, version=1)
            ).producer_id
            for _ in range(3)
        }
    assert len(ids) == 3


def test_sigterm_with_requests_in_flight_shuts_down_cleanly(broker):
    with RawClient(broker.bootstrap) as client:
        KafkaProducer(bootstrap_servers=broker.bootstrap).send("idle", b"x").get(timeout=10)
        partition = FetchRequest.FetchTopic.FetchPartition(
            partition=0,
            current_leader_epoch=-1,
            fetch_offset=1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        fetch = FetchRequest(
            replica_id=-1,
            max_wait_ms=30_000,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[FetchRequest.FetchTopic(topic="idle", partitions=[partition])],
            version=11,
        )
        fetch.with_header(correlation_id=1, client_id="long-poll")
        client.send_bytes(fetch.encode(framed=True, header=True))  # parked in a long poll
        assert broker.proc.stop(grace_s=10) == 0
    log_text = broker.proc.log_text()
    assert "storage flushed and closed" in log_text
    assert "Traceback" not in log_text and "ERROR" not in log_text
