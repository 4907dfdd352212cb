"""The group coordinator's state machine, driven directly on an event loop (no sockets needed).

Real clients exercise the happy paths in tests/integration/broker/test_clients.py; here the edge
cases a client
rarely hits on purpose: MEMBER_ID_REQUIRED, followers waiting for the leader in SyncGroup,
laggards evicted at the rebalance timeout, session expiry, heartbeat and commit error codes.
"""

from __future__ import annotations

import asyncio

from infra.broker.group_state import GroupState, JoinRequest
from infra.broker.groups import CoordinatorConfig, GroupCoordinator
from infra.broker.protocol import ErrorCode

FAST = CoordinatorConfig(initial_rebalance_delay_ms=10, session_check_interval_ms=20)


def join_request(member_id: str = "", session_ms: int = 1000, rebalance_ms: int = 300) -> JoinRequest:
    return JoinRequest(
        group_id="g",
        member_id=member_id,
        client_id="client",
        client_host="/127.0.0.1",
        protocol_type="consumer",
        protocols=[("range", b"meta-" + member_id.encode())],
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
    )


async def known_member(coordinator: GroupCoordinator, **kw) -> str:
    first = await coordinator.join(join_request(**kw))
    assert first.error == ErrorCode.MEMBER_ID_REQUIRED
    return first.member_id


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_two_members_join_one_generation_and_followers_wait_for_the_leader():
    async def scenario():
        coordinator = GroupCoordinator(FAST)
        one, two = await known_member(coordinator), await known_member(coordinator)
        joined = await asyncio.gather(
            coordinator.join(join_request(one)), coordinator.join(join_request(two))
        )
        assert {j.error for j in joined} == {ErrorCode.NONE}
        assert joined[0].generation == joined[1].generation == 1
        leader = next(j for j in joined if j.members)
        follower = next(j for j in joined if not j.members)
        assert {m[0] for m in leader.members} == {one, two}
        waiting = asyncio.ensure_future(coordinator.sync("g", 1, follower.member_id, {}))
        await asyncio.sleep(0.05)
        assert not waiting.done(), "the follower waits for the leader's assignment"
        plan = {one: b"p0", two: b"p1"}
        mine = await coordinator.sync("g", 1, leader.member_id, plan)
        theirs = await waiting
        assert (mine.assignment, theirs.assignment) == (plan[leader.member_id], plan[follower.member_id])
        assert coordinator.groups["g"].state is GroupState.STABLE
        assert coordinator.heartbeat("g", 1, one) == ErrorCode.NONE
        assert coordinator.heartbeat("g", 0, one) == ErrorCode.ILLEGAL_GENERATION
        assert coordinator.heartbeat("g", 1, "stranger") == ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario())


def test_member_that_does_not_rejoin_is_evicted_at_the_rebalance_timeout():
    async def scenario():
        coordinator = GroupCoordinator(FAST)
        one, two = await known_member(coordinator), await known_member(coordinator)
        await asyncio.gather(coordinator.join(join_request(one)), coordinator.join(join_request(two)))
        three = await known_member(coordinator)
        rejoin = asyncio.ensure_future(coordinator.join(join_request(one)))
        newcomer = asyncio.ensure_future(coordinator.join(join_request(three)))
        await asyncio.sleep(0.05)
        assert coordinator.heartbeat("g", 1, two) == ErrorCode.REBALANCE_IN_PROGRESS
        results = await asyncio.gather(rejoin, newcomer)  # `two` never rejoins: evicted after 300 ms
        assert {r.generation for r in results} == {2}
        assert set(coordinator.groups["g"].members) == {one, three}

    run(scenario())


def test_session_expiry_evicts_silent_member_and_empties_group():
    async def scenario():
        coordinator = GroupCoordinator(FAST)
        coordinator.start()
        member = await known_member(coordinator, session_ms=1000)
        joined = await coordinator.join(join_request(member, session_ms=1000))
        await coordinator.sync("g", joined.generation, member, {member: b"all"})
        await asyncio.sleep(1.3)  # no heartbeats
        group = coordinator.groups["g"]
        await coordinator.close()
        assert group.state is GroupState.EMPTY and not group.members
        assert coordinator.heartbeat("g", joined.generation, member) == ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario())


def test_leave_group_triggers_rebalance_and_commit_rules():
    async def scenario():
        coordinator = GroupCoordinator(FAST)
        one, two = await known_member(coordinator), await known_member(coordinator)
        await asyncio.gather(coordinator.join(join_request(one)), coordinator.join(join_request(two)))
        assert coordinator.commit_error("g", 1, one) == ErrorCode.REBALANCE_IN_PROGRESS  # awaiting sync
        assert coordinator.heartbeat("g", 1, one) == ErrorCode.NONE, "heartbeats between join and sync"
        await asyncio.gather(coordinator.sync("g", 1, one, {}), coordinator.sync("g", 1, two, {}))
        assert coordinator.commit_error("g", 1, one) is None
        assert coordinator.commit_error("g", 7, one) == ErrorCode.ILLEGAL_GENERATION
        assert coordinator.leave("g", [two, "ghost"]) == {
            two: ErrorCode.NONE,
            "ghost": ErrorCode.UNKNOWN_MEMBER_ID,
        }
        assert coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
        survivor = await coordinator.join(join_request(one))
        assert survivor.generation == 2 and [m[0] for m in survivor.members] == [one]
        assert coordinator.commit_error("other-group", -1, "") is None, "simple commits outside a group"

    run(scenario())


def test_join_errors():
    async def scenario():
        coordinator = GroupCoordinator(FAST)
        assert (await coordinator.join(join_request("nobody"))).error == ErrorCode.UNKNOWN_MEMBER_ID
        bad = join_request(session_ms=10)
        assert (await coordinator.join(bad)).error == ErrorCode.INVALID_SESSION_TIMEOUT
        old_client = join_request()
        old_client.requires_known_member_id = False  # JoinGroup v0-3: no MEMBER_ID_REQUIRED round trip
        assert (await coordinator.join(old_client)).error == ErrorCode.NONE

    run(scenario())


def test_a_new_member_joining_a_stable_group_triggers_a_rebalance():
    """Regression: a new member must not be answered from the stable generation (it would get an
    empty assignment and kafka-python would crash decoding it)."""

    async def scenario():
        coordinator = GroupCoordinator(FAST)
        one = await known_member(coordinator)
        first = await coordinator.join(join_request(one))
        await coordinator.sync("g", first.generation, one, {one: b"all"})
        assert coordinator.groups["g"].state is GroupState.STABLE
        newcomer = await known_member(coordinator)
        joining = asyncio.ensure_future(coordinator.join(join_request(newcomer)))
        await asyncio.sleep(0.05)
        assert not joining.done(), "the newcomer waits for a new generation"
        assert coordinator.groups["g"].state is GroupState.PREPARING_REBALANCE
        assert coordinator.heartbeat("g", first.generation, one) == ErrorCode.REBALANCE_IN_PROGRESS
        again = await coordinator.join(join_request(one))
        result = await joining
        assert (
            result.error == ErrorCode.NONE and result.generation == again.generation == first.generation + 1
        )

    run(scenario())


def test_stable_membership_survives_a_coordinator_restart():
    """Like Kafka's __consumer_offsets: after a broker restart, members keep heartbeating with their
    generation and get their assignment back, instead of the whole group rebalancing."""

    async def scenario():
        coordinator = GroupCoordinator(FAST)
        saves = []
        coordinator.on_membership_change = lambda: saves.append(coordinator.snapshot())
        one, two = await known_member(coordinator), await known_member(coordinator)
        joined = await asyncio.gather(
            coordinator.join(join_request(one)), coordinator.join(join_request(two))
        )
        leader = next(j for j in joined if j.members)
        follower = next(j for j in joined if not j.members)
        waiting = asyncio.ensure_future(coordinator.sync("g", 1, follower.member_id, {}))
        await asyncio.sleep(0)
        await coordinator.sync("g", 1, leader.member_id, {one: b"p0", two: b"p1"})
        await waiting
        assert saves, "a stable group is persisted"

        restarted = GroupCoordinator(FAST)
        assert restarted.restore(saves[-1]) == 1
        group = restarted.groups["g"]
        assert group.state is GroupState.STABLE and group.generation == 1
        assert restarted.heartbeat("g", 1, one) == ErrorCode.NONE
        assert (await restarted.sync("g", 1, two, {})).assignment == b"p1"

    run(scenario())
