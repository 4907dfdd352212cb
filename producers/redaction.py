"""Redaction of secrets and personal data before an event is published (issue #18).

One `Redactor` per process, built from the `redaction:` section of the settings file, is applied by
every producer path right before encoding: the SDK (`AgentRecorder.publish`, so the policy server's
recording too), the gateway (`/v1/events` and OTLP, in `producers.gateway._publish`) and
`agentstream ingest`. Each match is replaced by a typed placeholder, `[REDACTED:<detector>]`, and
counted in the event's `redactions` field.

    >>> r = Redactor.default()
    >>> r.redact_text("key AKIAIOSFODNN7EXAMPLE, mail ops@example.com")
    ('key [REDACTED:aws_access_key], mail [REDACTED:email]', 2)

Speed: each built-in detector has triggers (a literal, or a pattern starting with one) and runs only
when one of them is in the event's text, looked for once over all of its free-text fields; an event
with nothing to redact costs those dozen scans (`agentstream bench redaction`, docs/redaction.md).
A literal holding a rare character (`eyJ`, `AIza`, `xox`) is looked for only when that character
is in the text. `@` (code, mail) does not run the e-mail and URL-password patterns over each field:
one search over the event's text first asks for an `@` after a character an address or a password
can end with (and `://` for a URL), the same check `Detector.possible` does in each field.

Token ids: a `step.recorded` in which anything was redacted is published without its token ids
(`token_ids`, `logprobs`, `prompt_token_ids`, and those of every entry of `samples`) and with
`token_rl_eligible=False` (`withhold_tokens`): the ids are the text as the model read and wrote it,
secret included, and re-tokenising the redacted text would not be what the model sampled. The
policy server also withholds them when the prompt the model saw holds a secret, counting those
in `redactions` too (docs/redaction.md).

This module owns the detectors and the event walk; it does no I/O and must not import anything above
`producers`. The settings file's `redaction:` section, which chooses the detectors, is read by
`producers.redaction_settings`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schemas.events import EpisodeEnded, EpisodeStarted, EventBase, FeedbackAnnotation, StepRecorded

Trigger = str | re.Pattern[str]


@dataclass(frozen=True)
class Detector:
    """One kind of secret. `pattern` matches it; when the pattern has a group named `secret`, only
    that group is replaced (`Bearer [REDACTED:bearer_token]`). `triggers`: literals (or cheap
    patterns) one of which any match contains; the pattern runs only on text containing one of
    them. No triggers: the pattern always runs (user patterns)."""

    name: str
    pattern: re.Pattern[str]
    triggers: tuple[Trigger, ...] = ()

    @property
    def placeholder(self) -> str:
        return f"[REDACTED:{self.name}]"

    def sub(self, text: str) -> tuple[str, int]:
        """`text` with every match replaced, and how many there were."""
        return self.pattern.subn(self.replace, text)

    def possible(self, text: str) -> bool:
        """False only when `sub` surely replaces nothing in `text`, nor in any part of it (an event's
        fields are checked joined by newlines): a check, beyond the triggers, cheaper than `sub`."""
        return True

    def replace(self, match: re.Match[str]) -> str:
        if "secret" not in self.pattern.groupindex or match.group("secret") is None:
            return self.placeholder
        whole, start = match.group(0), match.start()
        return (
            whole[: match.start("secret") - start] + self.placeholder + whole[match.end("secret") - start :]
        )


def _detector(name: str, regex: str, *triggers: Trigger) -> Detector:
    return Detector(name, re.compile(regex), triggers)


class _PrivateKeyDetector(Detector):
    """From `-----BEGIN ... PRIVATE KEY-----` to its END line, or to the end of a cut-off text
    (`str.find` for the END line: a lazy regex would step through the whole block)."""

    def sub(self, text: str) -> tuple[str, int]:
        out, n, pos = [], 0, 0
        while (begin := self.pattern.search(text, pos)) is not None:
            end_line = f"-----END {begin.group(1)}-----"
            end = text.find(end_line, begin.end())
            out += [text[pos : begin.start()], self.placeholder]
            n, pos = n + 1, len(text) if end < 0 else end + len(end_line)
        return ("".join(out) + text[pos:], n) if n else (text, 0)


@dataclass(frozen=True)
class _AnyCaseDetector(Detector):
    """A case-insensitive pattern, tried only where `anchor` (lower case) is in the lower-cased
    text: an IGNORECASE regex has no literal to scan for and would try every position."""

    anchor: str = ""

    def sub(self, text: str) -> tuple[str, int]:
        if not text.isascii():  # lower() could change the length, so positions would not match
            return self.pattern.subn(self.replace, text)
        lowered = text.lower()
        out, n, pos, at = [], 0, 0, lowered.find(self.anchor)
        while at >= 0:
            match = self.pattern.match(text, at)
            if match is not None:
                out += [text[pos:at], self.replace(match)]
                n, pos = n + 1, match.end()
            at = lowered.find(self.anchor, max(at + 1, pos))
        return ("".join(out) + text[pos:], n) if n else (text, 0)


class _UrlPasswordDetector(Detector):
    """`scheme://user:password@host`: needs both `://` and an `@` right after a character a
    password can end with, two scans cheaper than the pattern's own (`@` is in code and mail)."""

    def possible(self, text: str) -> bool:
        return "://" in text and _URL_AT.search(text) is not None

    def sub(self, text: str) -> tuple[str, int]:
        if not self.possible(text):
            return text, 0
        return self.pattern.subn(self.replace, text)


_URL_AT = re.compile(r"@(?<=[^\s@/]@)")  # an `@` that can end `://user:password@`


def _any_case(name: str, anchor: str, regex: str, *triggers: Trigger) -> Detector:
    return _AnyCaseDetector(name, re.compile(regex, re.IGNORECASE), triggers, anchor)


_LOCAL_PART = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")


class _EmailDetector(Detector):
    """`local@domain.tld`: the pattern finds `@domain.tld` (a literal first, so the scan is fast),
    the local part is walked back from the `@` (at most 64 characters). Text with no `@` after a
    local-part character (`@decorator` at a line start, a lone `@`) is rejected by one search."""

    def possible(self, text: str) -> bool:
        return "@" in text and self.pattern.search(text) is not None

    def sub(self, text: str) -> tuple[str, int]:
        if "@" not in text:
            return text, 0
        out, n, pos = [], 0, 0
        for match in self.pattern.finditer(text):
            at = start = match.start()
            while start > max(pos, at - 64) and text[start - 1] in _LOCAL_PART:
                start -= 1
            if start < at:
                out += [text[pos:start], self.placeholder]
                n, pos = n + 1, match.end()
        return ("".join(out) + text[pos:], n) if n else (text, 0)


# Patterns start with their literal (the regex engine then scans for it quickly) and check the word
# boundary before it with a lookbehind. Order matters: a key block first (its base64 could feed
# later detectors), passwords in URLs before e-mail addresses (`user:pass@host.com`).
# Triggers are chosen for speed on text with nothing to redact: one `in` of a literal is a C scan
# (a single character is memchr); a pattern with a literal prefix replaces several `in`s.
_AT = "@"
_SK = "sk-"
# Characters rare in prose, logs and code, rarest first: a literal trigger holding one is looked for
# only when that character is in the text (one memchr, some 20 times cheaper than a 3-4 character
# `in`), so `eyJ`, `AIza`, `xox` cost next to nothing on text without `J`, `z`, `x`.
_RARE = "JQXZqjzxKVY"


def _probe(literal: str) -> str:
    """The rarest character of `literal` ("" if none is rare: `"" in text` is always true)."""
    return next((c for c in _RARE if c in literal), "")


BUILTIN_DETECTORS: tuple[Detector, ...] = (
    _PrivateKeyDetector(
        "private_key", re.compile(r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----"), ("PRIVATE KEY",)
    ),
    _detector(
        "aws_access_key",
        r"(?:AKIA|ASIA|ABIA|ACCA)(?<![A-Za-z0-9][A-Z]{4})[A-Z0-9]{16}(?![A-Za-z0-9])",
        re.compile("A(?:KIA|SIA|BIA|CCA)"),
    ),
    _any_case(
        "aws_secret_key",
        "aws",
        r"(?<![A-Za-z0-9])aws_?secret_?(?:access_?)?key(?:_id)?[\"']?\s*[:=]\s*[\"']?"
        r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
        "ecret",
        "ECRET",
    ),
    _detector(
        "github_token",
        r"(?:gh[pousr]_(?<![A-Za-z0-9_]gh._)[A-Za-z0-9]{36,255}"
        r"|github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{22,255})(?![A-Za-z0-9_])",
        re.compile("g(?:h[pousr]|ithub_pat)_"),
    ),
    _detector("anthropic_key", r"sk-ant-(?<![A-Za-z0-9_]sk-ant-)[A-Za-z0-9_\-]{20,}", _SK),
    _detector("openai_key", r"sk-(?<![A-Za-z0-9_]sk-)(?!ant-)[A-Za-z0-9_\-]{20,}", _SK),
    _detector("slack_token", r"xox(?<![A-Za-z0-9_]xox)[abposr]-[A-Za-z0-9\-]{10,}", "xox"),
    _detector("google_api_key", r"AIza(?<![A-Za-z0-9_]AIza)[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])", "AIza"),
    _detector(
        "jwt", r"eyJ(?<![A-Za-z0-9_]eyJ)[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", "eyJ"
    ),
    _any_case(
        "bearer_token",
        "bearer",
        r"(?<![A-Za-z0-9_])bearer\s+(?P<secret>(?=[A-Za-z._~+/\-]*[0-9])[A-Za-z0-9._~+/\-]{8,}=*)",
        "earer",
        "EARER",
    ),
    _UrlPasswordDetector("url_password", re.compile(r"://[^\s:/@]++:(?P<secret>[^\s@/]++)@"), (_AT,)),
    _EmailDetector(
        "email",
        re.compile(
            r"@(?<=[A-Za-z0-9._%+\-]@)[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9_])"
        ),
        (_AT,),
    ),
)
BUILTIN_NAMES: tuple[str, ...] = tuple(d.name for d in BUILTIN_DETECTORS)


class Redactor:
    """Applies detectors, in order, to text, JSON-like values and events (pure; thread-safe)."""

    def __init__(self, detectors: Iterable[Detector], enabled: bool = True):
        self.detectors: tuple[Detector, ...] = tuple(detectors) if enabled else ()
        triggers = tuple(dict.fromkeys(t for d in self.detectors for t in d.triggers))
        self._literals = tuple((t, _probe(t)) for t in triggers if isinstance(t, str))
        self._searches = tuple(t.search for t in triggers if not isinstance(t, str))
        self._always = any(not d.triggers for d in self.detectors)

    @classmethod
    def default(cls) -> Redactor:
        """Every built-in detector, on."""
        return cls(BUILTIN_DETECTORS)

    @property
    def enabled(self) -> bool:
        return bool(self.detectors)

    def redact_text(self, text: str) -> tuple[str, int]:
        """`text` with every match replaced by its placeholder, and the number of replacements."""
        return self._redact_text(text, self.active(text))

    def active(self, text: str) -> tuple[Detector, ...]:
        """The detectors that may match in `text`: their trigger is in it, or they have none;
        leading ones whose `possible` says no are dropped too (they would see `text` unchanged,
        so the check is exact; later ones run on text earlier detectors may have changed)."""
        found = {t for t, probe in self._literals if probe in text and t in text}
        found.update(s.__self__ for s in self._searches if s(text) is not None)
        if not found and not self._always:
            return ()
        out = [d for d in self.detectors if not d.triggers or not found.isdisjoint(d.triggers)]
        while out and not out[0].possible(text):
            del out[0]
        return tuple(out)

    @staticmethod
    def _redact_text(text: str, detectors: tuple[Detector, ...]) -> tuple[str, int]:
        total = 0
        for d in detectors:
            text, n = d.sub(text)
            total += n
        return text, total

    def redact_bytes(self, data: bytes) -> bytes:
        """Raw input (a dead letter's payload): redacted when it is UTF-8 text, else unchanged."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return data
        redacted, n = self.redact_text(text)
        return redacted.encode("utf-8") if n else data

    def redact_value(self, value: Any, detectors: tuple[Detector, ...] | None = None) -> tuple[Any, int]:
        """Strings inside dicts and lists (values, not keys) redacted; other values unchanged.
        `detectors`: the ones to apply (default: those `active` for each string)."""
        if isinstance(value, str):
            if not value:
                return value, 0
            return self._redact_text(value, self.active(value) if detectors is None else detectors)
        if isinstance(value, dict):
            out, total = {}, 0
            for key, item in value.items():
                out[key], n = self.redact_value(item, detectors)
                total += n
            return (out, total) if total else (value, 0)
        if isinstance(value, list | tuple):
            if not value or isinstance(value[0], int | float):  # token ids, logprobs: no text
                return value, 0
            items = [self.redact_value(item, detectors) for item in value]
            total = sum(n for _, n in items)
            return ([item for item, _ in items], total) if total else (value, 0)
        return value, 0

    def redact_event(self, event: EventBase) -> EventBase:
        """The event with its free-text fields redacted and `redactions` increased by the count;
        the same object when nothing matched (or for event types without free text)."""
        names = FREE_TEXT_FIELDS.get(type(event))
        if not names or not self.detectors:
            return event
        values = [getattr(event, name) for name in names]
        texts: list[str] = []
        for value in values:  # `_strings(values, texts)`, without a call for each plain field
            if value.__class__ is str:
                if value:
                    texts.append(value)
            elif value is not None:
                _strings(value, texts)
        # one look for the triggers over all the event's text: a clean event stops here
        detectors = self.active("\n".join(texts))
        if not detectors:
            return event
        update, total = {}, 0
        for name, value in zip(names, values, strict=True):
            value, n = self.redact_value(value, detectors)
            if n:
                update[name], total = value, total + n
        if not total:
            return event
        update["redactions"] = event.redactions + total
        if isinstance(event, StepRecorded):
            update |= _without_tokens(event, update.get("samples", event.samples))
        return event.model_copy(update=update)


TOKEN_FIELDS = ("token_ids", "logprobs", "prompt_token_ids")
SAMPLE_TOKEN_FIELDS = ("token_ids", "logprobs")


def withhold_tokens(step: StepRecorded, found: int = 0) -> StepRecorded:
    """`step` without the token ids that spell its text (and their logprobs), marked not
    token-trainable, with `found` more redactions counted (secrets found where the step keeps no
    text, e.g. in the prompt the policy server rendered).

    >>> from schemas.events import utc_now
    >>> s = StepRecorded(event_id="e", trajectory_id="t", occurred_at=utc_now(), producer="p",
    ...     step_index=0, token_ids=[5], logprobs=[-0.1], prompt_token_ids=[1, 2],
    ...     samples=[{"text": "b", "token_ids": [6], "logprobs": [-1.0]}])
    >>> w = withhold_tokens(s, 1)
    >>> w.token_ids, w.logprobs, w.prompt_token_ids, w.samples, w.token_rl_eligible, w.redactions
    (None, None, None, [{'text': 'b'}], False, 1)
    """
    update = _without_tokens(step, step.samples)
    update["redactions"] = step.redactions + found
    return step.model_copy(update=update)


def _without_tokens(step: StepRecorded, samples: list[dict] | None) -> dict[str, Any]:
    update: dict[str, Any] = dict.fromkeys(TOKEN_FIELDS)
    if samples is not None:
        update["samples"] = [
            {k: v for k, v in sample.items() if k not in SAMPLE_TOKEN_FIELDS} for sample in samples
        ]
    if step.token_rl_eligible is not None or any(getattr(step, f) is not None for f in TOKEN_FIELDS):
        update["token_rl_eligible"] = False
    return update


def _strings(value: Any, out: list[str]) -> None:
    """Append every non-empty string inside `value` (dict values, list items) to `out`."""
    if isinstance(value, str):
        if value:
            out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list | tuple) and value and not isinstance(value[0], int | float):
        for item in value:
            _strings(item, out)


# The fields of each published model that carry text an agent or a user wrote.
FREE_TEXT_FIELDS: dict[type[EventBase], tuple[str, ...]] = {
    EpisodeStarted: ("task", "metadata"),
    StepRecorded: ("thought", "params", "observation", "error", "samples"),
    EpisodeEnded: ("error",),
    FeedbackAnnotation: ("comment",),
}
