"""`agentstream bench redaction`: CPU time the redactor adds per 2 KB step (target: under 20 µs).

Three `step.recorded` events of about 2 KB of text (thought + params + observation): pytest output
with nothing to redact; Python source with decorators, e-mail-like text and URLs (the `@` and `://`
triggers fire, so the e-mail and URL-password patterns run); and shell output holding an AWS key, a
GitHub token, a bearer header and a private key block. Each is redacted `--steps` times per repeat
under `time.process_time` (CPU of this process, not wall time); figures are medians over repeats,
beside the CPU time of encoding the same event (`schemas.encode`, the peer every producer pays).
"""

from __future__ import annotations

import time

TARGET_US = 20.0


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=20_000, help="redactions per case per repeat")


def _pad(text: str, size: int) -> str:
    return (text * (size // len(text) + 1))[:size]


def _cases() -> dict[str, dict]:
    clean = _pad(
        "tests/test_io.py::test_read_chunks PASSED                                [ 12%]\n"
        "tests/test_io.py::test_write_atomic FAILED                               [ 25%]\n"
        "E       AssertionError: assert 'abc' == 'abd'\n  File \"src/io.py\", line 88, in write\n",
        1900,
    )
    code = _pad(
        "@pytest.fixture\ndef client(tmp_path):\n    # docs: https://docs.example.org/api#client\n"
        "    return Client(base_url='http://127.0.0.1:8080/v1', owner='team at example')\n",
        1900,
    )
    secrets = (
        "$ env\nAWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\nGITHUB_TOKEN=ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8\n"
        "> Authorization: Bearer abc123def456ghi789jkl\n-----BEGIN RSA PRIVATE KEY-----\n"
        + _pad("MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\n", 1500)
        + "-----END RSA PRIVATE KEY-----\n"
    )
    return {
        "clean (pytest output)": {"observation": clean},
        "clean, '@' and URLs (code)": {"observation": code},
        "4 secrets (key, token, bearer, PEM)": {"observation": secrets},
    }


def _step(observation: str):
    from schemas import StepRecorded, utc_now

    return StepRecorded(
        event_id="e1", trajectory_id="t1", occurred_at=utc_now(), producer="bench", step_index=3,
        thought="run the failing test to see the traceback", tool="bash",
        params={"command": "pytest -x tests/test_io.py", "timeout": 60}, observation=observation,
    )  # fmt: skip


def _cpu_us(fn, event, steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        fn(event)
    return (time.process_time() - start) / steps * 1e6


def run(args) -> dict:
    from infra.bench.report import median
    from producers.redaction import Redactor
    from schemas import encode

    redactor = Redactor.default()
    rows, raw = [], {}
    for name, fields in _cases().items():
        event = _step(**fields)
        redact = [_cpu_us(redactor.redact_event, event, args.steps) for _ in range(max(1, args.repeats))]
        enc = [_cpu_us(encode, event, args.steps) for _ in range(max(1, args.repeats))]
        out = redactor.redact_event(event)
        raw[name] = {"redact_us": redact, "encode_us": enc}
        rows.append(
            {
                "step": name,
                "event bytes": len(encode(event)),
                "redactions": out.redactions,
                "redact CPU µs/step": median(redact),
                "encode CPU µs/step": median(enc),
                "redact/encode": median(redact) / median(enc),
                f"under {TARGET_US:.0f} µs": median(redact) < TARGET_US,
            }
        )
    return {
        "rows": rows,
        "target_us": TARGET_US,
        "steps_per_repeat": args.steps,
        "repeats": args.repeats,
        **raw,
    }
