"""The dispatch table: which handler answers which API key.

A handler is `async (BrokerState, Request) -> response body | None` (None only for acks=0
Produce). Every API key in the advertised profile has exactly one entry here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from infra.broker import handlers_cluster as cluster
from infra.broker import handlers_groups as groups
from infra.broker import handlers_records as records
from infra.broker.protocol import Request
from infra.broker.state import BrokerState

Handler = Callable[[BrokerState, Request], Awaitable[object | None]]

HANDLERS: dict[int, Handler] = {
    0: records.handle_produce,
    1: records.handle_fetch,
    2: records.handle_list_offsets,
    3: cluster.handle_metadata,
    8: groups.handle_offset_commit,
    9: groups.handle_offset_fetch,
    10: groups.handle_find_coordinator,
    11: groups.handle_join_group,
    12: groups.handle_heartbeat,
    13: groups.handle_leave_group,
    14: groups.handle_sync_group,
    15: groups.handle_describe_groups,
    16: groups.handle_list_groups,
    18: cluster.handle_api_versions,
    19: cluster.handle_create_topics,
    20: cluster.handle_delete_topics,
    22: records.handle_init_producer_id,
    23: records.handle_offset_for_leader_epoch,
    24: records.handle_add_partitions_to_txn,
    25: records.handle_add_offsets_to_txn,
    26: records.handle_end_txn,
    28: records.handle_txn_offset_commit,
    32: cluster.handle_describe_configs,
    60: cluster.handle_describe_cluster,
}
