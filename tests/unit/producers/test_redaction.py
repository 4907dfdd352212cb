"""The redactor: each built-in detector on a real-looking secret and on near misses, placeholders and
counts on events, the settings file's `redaction:` section (user patterns, detectors turned off,
errors naming the file, the field and the value)."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.redaction import BUILTIN_NAMES, Redactor
from producers.redaction_settings import load_redactor, load_settings, parse_section, settings_file
from schemas.codec import decode, encode
from schemas.events import EpisodeEnded, EpisodeStarted, FeedbackAnnotation, StepRecorded, utc_now

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\n"
    "-----END RSA PRIVATE KEY-----"
)

# (detector, before, secret, after): the secret alone is replaced by `[REDACTED:<detector>]`
POSITIVES = [
    ("aws_access_key", "key=", AWS_KEY, " ok"),
    ("aws_access_key", "", "ASIAY34FZKBOKMUTVV7A", ""),
    ("aws_secret_key", "aws_secret_access_key = ", AWS_SECRET, ""),
    ("aws_secret_key", 'AWS_SECRET_ACCESS_KEY="', AWS_SECRET, '"'),
    ("github_token", "token ", GITHUB, "."),
    ("github_token", "", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", ""),
    ("github_token", "", "gho_" + "Z" * 36, ""),
    ("anthropic_key", "ANTHROPIC_API_KEY=", "sk-ant-api03-" + "x7" * 20, ""),
    ("openai_key", "", "sk-proj-" + "Ab9_" * 10, ""),
    ("slack_token", "", "xoxb-1234567890-0987654321-abcdefGHIJ", ""),
    ("google_api_key", "", "AIzaSyA-1234567890abcdefghijklmnopqrstu", ""),
    ("jwt", "cookie: session=", JWT, ";"),
    ("bearer_token", "Authorization: Bearer ", "abc123def456ghi789", ""),
    ("bearer_token", "authorization: bearer ", "9f8e7d6c5b4a.XYZ=", ""),
    ("private_key", "key:\n", PEM, "\ndone"),
    ("private_key", "", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA", ""),
    ("url_password", "postgres://admin:", "s3cr3t!", "@db.internal:5432/app"),
    ("email", "write to ", "ops.team+alerts@example.co.uk", " now"),
]

NEAR_MISSES = [
    "AKIAIOSFODNN7EXAMP",  # 14 characters after AKIA
    "XAKIAIOSFODNN7EXAMPLE1",  # inside a longer word
    "akiaiosfodnn7example",  # lower case
    "aws_secret_access_key = short",
    "ghp_short ghx_" + "a" * 36,
    "task-1234567890abcdefghij1234 sk-short",
    "xoxz-1234567890-abcdef",
    "AIza" + "x" * 20,
    "eyJhbGciOiJIUzI1NiJ9 alone",
    'the bearer of good news; WWW-Authenticate: Bearer realm="agentstream"',
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOC\n-----END PUBLIC KEY-----",
    "https://example.com:8080/path?q=a@b and ftp://host/file",
    "@decorator, user@localhost, a@b.c",
    "src/app.py:12: error: Name 'x' is not defined  [name-defined]",
]


@pytest.mark.parametrize(("detector", "before", "secret", "after"), POSITIVES)
def test_each_detector_replaces_its_secret_with_a_typed_placeholder(detector, before, secret, after):
    expected = f"{before}[REDACTED:{detector}]{after}"
    assert Redactor.default().redact_text(before + secret + after) == (expected, 1)


def test_every_builtin_detector_has_a_positive_case():
    assert {case[0] for case in POSITIVES} == set(BUILTIN_NAMES)


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_are_left_alone(text):
    assert Redactor.default().redact_text(text) == (text, 0)


def test_several_secrets_in_one_text_are_each_counted():
    text = f"{AWS_KEY} and {GITHUB}\nAuthorization: Bearer abc123def456\n{PEM}\nmail me@example.org"
    redacted, n = Redactor.default().redact_text(text)
    assert n == 5
    for secret in (AWS_KEY, GITHUB, "abc123def456", "MIIEowIBAAKCAQEA", "me@example.org"):
        assert secret not in redacted
    assert redacted.count("[REDACTED:") == 5


def _step(**fields) -> StepRecorded:
    base = {
        "event_id": "e1",
        "trajectory_id": "t1",
        "occurred_at": utc_now(),
        "producer": "test",
        "step_index": 0,
    }
    return StepRecorded(**(base | fields))


def test_a_step_is_redacted_in_every_free_text_field_and_counted():
    step = _step(
        thought=f"use {AWS_KEY}", params={"headers": {"Authorization": "Bearer abc123def456"}, "n": 3},
        observation=PEM, error="login as root@example.com failed",
        samples=[{"text": GITHUB, "token_ids": [1, 2]}], tool="bash", token_ids=[5, 6],
    )  # fmt: skip
    out = Redactor.default().redact_event(step)
    assert out.redactions == 5
    assert out.thought == "use [REDACTED:aws_access_key]"
    assert out.params == {"headers": {"Authorization": "Bearer [REDACTED:bearer_token]"}, "n": 3}
    assert out.observation == "[REDACTED:private_key]"
    assert out.error == "login as [REDACTED:email] failed"
    # the token ids spell the secrets too (#34 item 16): withheld, the step not token-trainable
    assert out.samples == [{"text": "[REDACTED:github_token]"}]
    assert (out.event_id, out.tool, out.token_ids, out.token_rl_eligible) == ("e1", "bash", None, False)
    decoded = decode(encode(out))
    assert decoded.redactions == 5 and AWS_KEY.encode() not in encode(out)


def test_a_clean_event_comes_back_as_the_same_object_with_no_count():
    step = _step(thought="list the files", observation="a.py b.py", params={"cmd": "ls"})
    assert Redactor.default().redact_event(step) is step
    assert step.redactions == 0 and b'"redactions":0' in encode(step)


def test_counts_add_to_what_an_upstream_producer_already_redacted():
    assert Redactor.default().redact_event(_step(observation=AWS_KEY, redactions=2)).redactions == 3


def test_episode_and_feedback_text_is_redacted():
    env = {"trajectory_id": "t1", "occurred_at": utc_now(), "producer": "test"}
    started = EpisodeStarted(
        event_id="s", task_id="k", task=f"deploy with {AWS_KEY}", metadata={"token": GITHUB}, **env
    )
    ended = EpisodeEnded(event_id="d", success=False, error="Bearer abc123def456 rejected", **env)
    note = FeedbackAnnotation(event_id="f", score=1.0, comment="mail a@example.com", **env)
    r = Redactor.default()
    assert r.redact_event(started).task == "deploy with [REDACTED:aws_access_key]"
    assert r.redact_event(started).metadata == {"token": "[REDACTED:github_token]"}
    assert (r.redact_event(ended).error, r.redact_event(ended).redactions) == (
        "Bearer [REDACTED:bearer_token] rejected",
        1,
    )
    assert r.redact_event(note).comment == "mail [REDACTED:email]"


def test_dead_letter_payloads_are_redacted_when_they_are_text():
    r = Redactor.default()
    assert (
        r.redact_bytes(f'{{"observation": "{AWS_KEY}"}}'.encode())
        == b'{"observation": "[REDACTED:aws_access_key]"}'
    )
    assert r.redact_bytes(b"\xff\xfe" + AWS_KEY.encode()) == b"\xff\xfe" + AWS_KEY.encode()


# --- settings -----------------------------------------------------------------------------------


def _write(tmp_path, text: str):
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


def test_user_patterns_and_a_detector_turned_off(tmp_path):
    path = _write(
        tmp_path,
        "redaction:\n  detectors:\n    email: false\n  patterns:\n"
        "    - name: ticket\n      regex: 'TICKET-[0-9]{6}'\n",
    )
    redactor = load_settings(path).redactor()
    text, n = redactor.redact_text(f"see TICKET-123456 from ops@example.com with {AWS_KEY}")
    assert (text, n) == ("see [REDACTED:ticket] from ops@example.com with [REDACTED:aws_access_key]", 2)


def test_redaction_can_be_turned_off_as_a_whole(tmp_path):
    redactor = load_settings(_write(tmp_path, "redaction:\n  enabled: false\n")).redactor()
    step = _step(observation=AWS_KEY)
    assert not redactor.enabled and redactor.redact_event(step) is step


def test_no_file_means_every_builtin_detector_on():
    assert [d.name for d in load_settings(None).redactor().detectors] == list(BUILTIN_NAMES)


_PATTERN = "redaction:\n  patterns:\n    - name: {}\n      regex: '{}'\n"
BAD_SECTIONS = [
    (_PATTERN.format("bad", "(unclosed"), ["redaction.patterns[0].regex", "(unclosed"]),
    (_PATTERN.format("Bad Name", "x"), ["redaction.patterns[0].name", "Bad Name"]),
    (_PATTERN.format("empty", "a*"), ["redaction.patterns[0].regex", "empty string"]),
    ("redaction:\n  detectors:\n    emails: false\n", ["redaction.detectors.emails", "email"]),
    ("redaction:\n  detectors:\n    email: 'no'\n", ["redaction.detectors.email", "'no'"]),
    ("redaction:\n  enabled: maybe\n", ["redaction.enabled", "'maybe'"]),
    ("redaction:\n  colour: red\n", ["redaction.colour", "'red'"]),
    ("redaction: [1, 2]\n", ["redaction.", "[1, 2]"]),
    ("redaction:\n  - : :\n  bad", ["not valid YAML"]),
]


@pytest.mark.parametrize(("section", "names"), BAD_SECTIONS)
def test_a_bad_settings_file_is_an_error_naming_the_file_the_field_and_the_value(tmp_path, section, names):
    path = _write(tmp_path, section)
    with pytest.raises(ProducerError) as err:
        load_settings(path)
    for name in [str(path), *names]:
        assert name in str(err.value)


def test_which_settings_file_applies(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_SETTINGS_FILE", raising=False)
    assert settings_file(None, tmp_path) is None
    default = _write(tmp_path, "redaction: {}\n")
    assert settings_file(None, tmp_path) == default
    other = tmp_path / "other.yaml"
    other.write_text("redaction:\n  enabled: false\n")
    monkeypatch.setenv("AGENTSTREAM_SETTINGS_FILE", str(other))
    assert settings_file(None, tmp_path) == other
    assert not load_redactor(None, tmp_path).enabled
    assert settings_file(default, tmp_path) == default
    monkeypatch.setenv("AGENTSTREAM_SETTINGS_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ProducerError, match=r"missing\.yaml"):
        settings_file(None, tmp_path)


def test_parse_section_reads_a_mapping():
    settings = parse_section(
        {"detectors": {"jwt": False}, "patterns": [{"name": "pin", "regex": r"PIN \d{4}"}]}
    )
    assert settings.disabled == {"jwt"} and settings.patterns == (("pin", r"PIN \d{4}"),)


def test_a_user_pattern_with_a_secret_group_replaces_only_that_part():
    settings = parse_section({"patterns": [{"name": "db_password", "regex": r"DB_PASSWORD=(?P<secret>\S+)"}]})
    assert settings.redactor().redact_text("DB_PASSWORD=hunter2 ok") == (
        "DB_PASSWORD=[REDACTED:db_password] ok",
        1,
    )


def test_case_insensitive_detectors_work_on_non_ascii_text():
    text = "Grüße, İstanbul: BEARER abc123def456 and aws_secret_access_key=" + AWS_SECRET
    assert Redactor.default().redact_text(text) == (
        "Grüße, İstanbul: BEARER [REDACTED:bearer_token] and aws_secret_access_key=[REDACTED:aws_secret_key]",
        2,
    )


# The `@` and `://` fast paths: a text whose every `@` follows a character no address or password
# can end with is rejected before the patterns run; these are the edges of that check.
AT_AND_URL_CASES = [
    ("ops@example.com", "[REDACTED:email]", 1),  # the whole text
    ("ops@example.com wrote", "[REDACTED:email] wrote", 1),  # at the very start
    ("mail ops@example.com", "mail [REDACTED:email]", 1),  # at the very end
    ("a@x.io, b.c@y.io;d+e@z.co.uk", "[REDACTED:email], [REDACTED:email];[REDACTED:email]", 3),
    (
        "postgres://admin:p@ss@db.internal:5432/app",  # an `@` inside the password
        "postgres://admin:[REDACTED:url_password]@[REDACTED:email]:5432/app",
        2,
    ),
    (
        "https://user:pw@host.example.com/x ops@example.com",
        "https://user:[REDACTED:url_password]@host.example.com/x [REDACTED:email]",
        2,
    ),
    ("key sk-short and ops@example.com", "key sk-short and [REDACTED:email]", 1),  # another trigger first
    ("@pytest.fixture\n@app.route('/x')\ndef f():\n    return 'https://docs.example.org/api'", None, 0),
    ("me@host then https://example.com/p", None, 0),
    ("@", None, 0),
    ("://@", None, 0),
]


@pytest.mark.parametrize(("text", "expected", "count"), AT_AND_URL_CASES)
def test_at_signs_and_urls_at_the_edges(text, expected, count):
    assert Redactor.default().redact_text(text) == (text if expected is None else expected, count)


def test_a_step_of_decorators_and_urls_with_nothing_to_redact_is_the_same_object():
    code = "@pytest.fixture\ndef client():\n    return Client('http://127.0.0.1:8080/v1')  # https://x.org\n"
    step = _step(thought="@ the start", params={"cmd": "cat conftest.py"}, observation=code * 20)
    assert Redactor.default().redact_event(step) is step


def test_an_address_in_one_field_is_found_when_another_field_has_decorators():
    step = _step(thought="@decorator", observation="@app.route('/')\nmail ops@example.com")
    out = Redactor.default().redact_event(step)
    assert (out.thought, out.observation, out.redactions) == (
        "@decorator",
        "@app.route('/')\nmail [REDACTED:email]",
        1,
    )


def test_rare_character_triggers_still_find_their_secrets():
    text = f"{JWT} AIzaSyA-1234567890abcdefghijklmnopqrstu xoxb-1234567890-abcdefGHIJ"
    assert Redactor.default().redact_text(text) == (
        "[REDACTED:jwt] [REDACTED:google_api_key] [REDACTED:slack_token]",
        3,
    )
