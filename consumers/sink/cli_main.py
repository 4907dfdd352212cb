"""`agentstream sink` entry point: settings in, SinkConfig out, run until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from schemas.settings import Settings

log = logging.getLogger(__name__)


def run(args) -> int:
    from consumers.sink.runner import SinkConfig, run_sink

    settings = Settings.from_args(args)
    config = SinkConfig(
        bootstrap_servers=settings.bootstrap_servers,
        clickhouse_url=settings.resolved_clickhouse_url,
        group_id=args.group_id,
        batch_rows=args.batch_rows,
        flush_interval_s=args.flush_interval_s,
        max_retry_s=args.max_retry_s,
        from_beginning=bool(args.from_beginning),
        endpoint_port=args.endpoint_port,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def ready(url: str) -> None:
        log.info(
            "sink consuming %d topics into %s (readers: %s)", len(config.topics), config.clickhouse_url, url
        )
        if args.ready_file:
            path = Path(args.ready_file)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(url)
            tmp.replace(path)

    stats = run_sink(config, stop, ready)
    log.info("sink stopped: %s", stats)
    return 0
