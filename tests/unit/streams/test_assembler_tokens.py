"""The assembler carries each step's recorded token fields (tokenizer hash included) and event id into
`trajectory.scored`."""

from __future__ import annotations

import json

from streams.assembler.assembly import Assembly
from streams.assembler.reward_math import Calibrations
from tests.support.streams_events import REG, trajectory


def test_scored_steps_carry_prompt_deltas_continuity_and_event_ids_through_the_stored_state():
    started, steps, ended, rewards = trajectory()
    tokens = [
        {"token_ids": [10 + i], "logprobs": [-0.5], "prompt_token_ids": [i, i + 1],
         "prompt_delta_start": 0 if i == 0 else 2 * i, "token_continuity": "first" if i == 0 else "ok",
         "tokenizer_hash": f"tok{i}"}
        for i in range(len(steps))
    ]  # fmt: skip
    steps = [s.model_copy(update=t) for s, t in zip(steps, tokens, strict=True)]
    a = Assembly()
    for e in [started, *steps, *rewards, ended]:
        a.add(e, 0.0)
        a = Assembly.from_dict(json.loads(json.dumps(a.to_dict())))  # the changelog round trip
    scored = a.decide("t", REG, Calibrations(), 0.0, 30.0)
    assert scored is not None
    for step, event, t in zip(scored.steps, steps, tokens, strict=True):
        assert step.event_id == event.event_id
        assert step.prompt_token_ids == t["prompt_token_ids"] and step.token_ids == t["token_ids"]
        assert step.tokenizer_hash == t["tokenizer_hash"]  # the GRPO builder checks it (since 1.4)
        assert (step.prompt_delta_start, step.token_continuity) == (
            t["prompt_delta_start"],
            t["token_continuity"],
        )
