"""Exceptions of the embedded broker (`infra.broker`), httpx style: the tree, then the classes.

    InfraError (infra.errors)
    └── BrokerError
        ├── BrokerStorageError            storage layer (log, store, records)
        │   ├── InvalidRecordError
        │   │   └── CorruptRecordError
        │   ├── OutOfOrderSequenceError
        │   ├── InvalidProducerEpochError
        │   ├── OffsetOutOfRangeError
        │   ├── InvalidConfigError
        │   ├── TopicExistsError
        │   ├── InvalidTopicError
        │   ├── InvalidPartitionsError
        │   ├── UnknownTopicError
        │   │   └── UnknownPartitionError
        │   ├── StorageIOError
        │   ├── StoredBatchCorruptError
        │   └── RecordTooLargeError
        └── BrokerProtocolError           network layer (server, protocol, handlers)
            └── MalformedRequestError

Each storage class names the Kafka error it maps to, so the protocol handlers can translate without
guessing. Messages name the field and the value received.
"""

from __future__ import annotations

from infra.errors import InfraError


class BrokerError(InfraError):
    """Root of the embedded broker's errors."""


class BrokerStorageError(BrokerError):
    """Root of every error raised by the broker's storage layer (Kafka: UNKNOWN_SERVER_ERROR, -1)."""


class InvalidRecordError(BrokerStorageError):
    """A produced records blob is not a valid v2 record batch sequence (Kafka: INVALID_RECORD, 87)."""


class CorruptRecordError(InvalidRecordError):
    """A record batch whose CRC-32C does not match its bytes (Kafka: CORRUPT_MESSAGE, 2)."""


class OutOfOrderSequenceError(BrokerStorageError):
    """An idempotent batch out of sequence (Kafka: OUT_OF_ORDER_SEQUENCE_NUMBER, 45)."""


class InvalidProducerEpochError(BrokerStorageError):
    """A batch from an older epoch of a producer id than already seen (Kafka: INVALID_PRODUCER_EPOCH, 47)."""


class OffsetOutOfRangeError(BrokerStorageError):
    """A read below the log start offset or above the high watermark (Kafka: OFFSET_OUT_OF_RANGE, 1)."""


class InvalidConfigError(BrokerStorageError):
    """A topic config value that cannot be used (Kafka: INVALID_CONFIG, 40)."""


class TopicExistsError(BrokerStorageError):
    """CreateTopics for a name that already exists (Kafka: TOPIC_ALREADY_EXISTS, 36)."""


class InvalidTopicError(BrokerStorageError):
    """A topic name Kafka would refuse (Kafka: INVALID_TOPIC_EXCEPTION, 17)."""


class InvalidPartitionsError(BrokerStorageError):
    """A partition count below 1 (Kafka: INVALID_PARTITIONS, 37)."""


class UnknownTopicError(BrokerStorageError):
    """A topic that does not exist (Kafka: UNKNOWN_TOPIC_OR_PARTITION, 3)."""


class UnknownPartitionError(UnknownTopicError):
    """A partition index outside the topic's range (Kafka: UNKNOWN_TOPIC_OR_PARTITION, 3)."""


class StorageIOError(BrokerStorageError):
    """A write or fsync of the log failed (disk full, I/O error) (Kafka: KAFKA_STORAGE_ERROR, 56)."""


class StoredBatchCorruptError(BrokerStorageError):
    """A stored batch whose bytes no longer match its CRC-32C: never served (Kafka: CORRUPT_MESSAGE, 2)."""


# -- network layer (server, protocol, handlers) ---------------------------------------------------


class BrokerProtocolError(BrokerError):
    """Root of the network layer's errors: a client sent something the broker cannot serve."""


class MalformedRequestError(BrokerProtocolError):
    """A frame that cannot be a Kafka request (the connection that sent it is closed)."""


class RecordTooLargeError(BrokerStorageError):
    """A record batch larger than the topic's max.message.bytes (Kafka: MESSAGE_TOO_LARGE, 10)."""
