"""A kafka-python producer (acks=all, idempotent) that records every acknowledged message.

Usage: python -m tests.support.acks_producer BOOTSTRAP TOPIC ACKS_FILE
Sends "n" (n = 0, 1, 2, ...) keyed by n until killed; on each acknowledgement appends
"partition offset n" to ACKS_FILE (flushed), so a test knows exactly what the broker confirmed.
"""

from __future__ import annotations

import sys

from kafka import KafkaProducer


def main(bootstrap: str, topic: str, acks_path: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    with open(acks_path, "a", buffering=1) as acks:

        def acknowledged(n: int):
            def record(metadata) -> None:
                acks.write(f"{metadata.partition} {metadata.offset} {n}\n")

            return record

        n = 0
        while True:
            value = str(n).encode()
            producer.send(topic, key=value, value=value).add_callback(acknowledged(n))
            n += 1
            if n % 200 == 0:
                producer.flush()


if __name__ == "__main__":
    main(*sys.argv[1:4])
