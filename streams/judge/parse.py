"""Parsing the judge model's reply: strict JSON first, then tolerant repair, never a made-up score.

Repairs, tried in order on each candidate (the whole text, a ```json fenced block, the outermost
braces, everything from the first brace): trailing commas, single-quoted strings, Python literals,
and truncation (close an open string, drop a dangling key, close brackets). A number at the very
end of a truncated reply is dropped, not kept: 0.75 cut to 0.7 would be a score nobody gave.
A rubric the model did not score, or scored with something that is not a number in [0, 1]
(a small overshoot such as 1.02 is clamped), is missing: absent, never 0.5. A reply nothing can
be recovered from raises `ParseError`, which the processor turns into a `reward.judge.failed` event.

>>> extract_json('```json\\n{"scores": {"a": 0.8,}, }\\n```')
{'scores': {'a': 0.8}}
>>> extract_json('{"scores": {"a": 0.8, "b": 0.75')
{'scores': {'a': 0.8}}
>>> extract_json("{'scores': {'a': 1}, 'rationale': 'ok'}")
{'scores': {'a': 1}, 'rationale': 'ok'}
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from streams.errors import ParseError

CLAMP_TOLERANCE = 0.05
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)(?:```|$)", re.DOTALL)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


def extract_json(text: str) -> dict:
    """The JSON object in a model reply, repaired if needed; ParseError if none can be recovered."""
    for candidate in _candidates(text):
        for attempt in itertools.chain((candidate,), _repairs(candidate)):  # lazily: repairs cost
            try:
                value = json.loads(attempt)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    raise ParseError(f"no JSON object could be recovered from the reply: {text[:200]!r}")


def _candidates(text: str) -> list[str]:
    text = text.strip()
    found = [text]
    found += [m.group(1).strip() for m in _FENCE.finditer(text) if m.group(1).strip()]
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        found.append(text[first : last + 1])
    if first != -1:
        found.append(text[first:])
    return list(dict.fromkeys(found))


def _repairs(candidate: str) -> Iterable[str]:
    normalised = _normalise(candidate)
    yield normalised
    trimmed = normalised
    for attempt in range(200):  # drop trailing fragments one comma at a time until it closes
        # A number at the very end may have been cut short (0.75 -> 0.7): drop it, never close it.
        # (After a cut at a separator the number before it was complete.)
        if attempt > 0 or not _ends_in_number(trimmed):
            yield _close(trimmed)
        cut = _last_separator(trimmed)
        if cut <= 0:
            return
        trimmed = trimmed[:cut]


def _ends_in_number(text: str) -> bool:
    return bool(text) and (text[-1].isdigit() or text[-1] in ".-+eE") and not _open_string(text)


def _normalise(text: str) -> str:
    """Single quotes to double, Python literals to JSON, trailing commas removed (outside strings)."""
    out: list[str] = []
    quote = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and i + 1 < len(text):
                nxt = text[i + 1]
                out.append(nxt if (quote == "'" and nxt == "'") else ch + nxt)
                i += 2
                continue
            if ch == quote:
                out.append('"')
                quote = None
            else:
                out.append('\\"' if (ch == '"' and quote == "'") else ch)
        elif ch in "\"'":
            quote = ch
            out.append('"')
        else:
            word = re.match(r"True|False|None", text[i:])
            if word and not (out and (out[-1].isalnum() or out[-1] == "_")):
                out.append(_PY_LITERALS[word.group(0)])
                i += len(word.group(0))
                continue
            out.append(ch)
        i += 1
    joined = "".join(out) + ('"' if quote else "")
    return _strip_trailing_commas(joined)


def _scan(text: str):
    """Yield (index, char, in_string) for a double-quoted JSON-ish text; `in_string` is the state
    after the char (an opening quote is inside the string, its closing quote is not)."""
    in_string = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif in_string and ch == "\\":
            escaped = True
        elif ch == '"':
            in_string = not in_string
        yield i, ch, in_string


def _strip_trailing_commas(text: str) -> str:
    keep = [True] * len(text)
    last_comma = None
    for i, ch, in_string in _scan(text):
        if in_string:
            last_comma = None
        elif ch == ",":
            last_comma = i
        elif ch in "}]" and last_comma is not None:
            keep[last_comma] = False
            last_comma = None
        elif not ch.isspace():
            last_comma = None
    return "".join(c for c, k in zip(text, keep, strict=True) if k)


def _close(text: str) -> str:
    """Close an open string and every open bracket; drop a dangling comma or key separator."""
    stack: list[str] = []
    for _, ch, inside in _scan(text):
        if not inside:
            if ch in "{[":
                stack.append("}" if ch == "{" else "]")
            elif ch in "}]" and stack:
                stack.pop()
    body = text + ('"' if _open_string(text) else "")
    body = body.rstrip()
    while body.endswith(","):
        body = body[:-1].rstrip()
    if body.endswith(":"):
        body += " null"
    return body + "".join(reversed(stack))


def _open_string(text: str) -> bool:
    """Whether `text` ends inside a string."""
    states = [inside for _, _, inside in _scan(text)]
    return bool(states) and states[-1]


def _last_separator(text: str) -> int:
    last = -1
    for i, ch, inside in _scan(text):
        if not inside and ch in ",{[":
            last = i + (0 if ch == "," else 1)
    return last


# --- scores -------------------------------------------------------------------------------------


@dataclass
class Judgment:
    """Scores and rationale the model gave one target (a step, a trajectory)."""

    scores: dict[str, float]
    rationale: str = ""
    problems: list[str] = field(default_factory=list)


def normalize_scores(raw: object, rubric_ids: Iterable[str]) -> tuple[dict[str, float], list[str]]:
    """Known rubrics with a usable number; everything else is reported, never filled in.

    >>> normalize_scores({"a": 1.02, "b": "0.5", "c": 7, "z": 1}, ["a", "b", "c", "d"])
    ({'a': 1.0, 'b': 0.5}, ['c: 7 is outside 0..1', 'd: not scored', 'z: not a rubric of this set'])
    """
    ids = list(rubric_ids)
    raw = raw if isinstance(raw, dict) else {}
    scores: dict[str, float] = {}
    problems: list[str] = []
    for rid in ids:
        if rid not in raw:
            problems.append(f"{rid}: not scored")
            continue
        value, problem = _score_value(raw[rid])
        if problem:
            problems.append(f"{rid}: {problem}")
        else:
            scores[rid] = value
    problems += [f"{k}: not a rubric of this set" for k in raw if k not in ids]
    return scores, sorted(problems)


def _score_value(value: object) -> tuple[float, str | None]:
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0.0, f"{value!r} is not a number"
    try:
        number = float(value)
    except ValueError:
        return 0.0, f"{value!r} is not a number"
    if math.isnan(number) or math.isinf(number):
        return 0.0, f"{value!r} is not a finite number"
    if -CLAMP_TOLERANCE <= number <= 1 + CLAMP_TOLERANCE:
        return min(1.0, max(0.0, number)), None
    return 0.0, f"{value!r} is outside 0..1"


def _judgment(entry: object, rubric_ids: list[str]) -> Judgment:
    entry = entry if isinstance(entry, dict) else {}
    scores, problems = normalize_scores(entry.get("scores"), rubric_ids)
    rationale = entry.get("rationale") or entry.get("reason") or ""
    return Judgment(scores, str(rationale)[:2000], problems)


def parse_steps(text: str, rubric_ids: list[str], step_indices: list[int]) -> dict[int, Judgment]:
    """Per step index, what the model said. Steps it did not cover are absent from the result."""
    data = extract_json(text)
    entries = data.get("steps")
    if not isinstance(entries, list):
        if "scores" in data and len(step_indices) == 1:
            return {step_indices[0]: _judgment(data, rubric_ids)}
        raise ParseError(f"reply has no 'steps' list (keys: {sorted(data)})")
    result: dict[int, Judgment] = {}
    positional = len(entries) == len(step_indices)
    for position, entry in enumerate(entries):
        index = _step_index(entry, position if positional else None, step_indices)
        if index is not None and index in step_indices:
            result[index] = _judgment(entry, rubric_ids)
    return result


def _step_index(entry: object, position: int | None, step_indices: list[int]) -> int | None:
    if not isinstance(entry, dict):
        return None
    for key in ("step", "step_index", "index"):
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    # No index given: take the order only when it lines up one-to-one with the request.
    return step_indices[position] if position is not None else None


def parse_trajectory(text: str, rubric_ids: list[str]) -> Judgment:
    data = extract_json(text)
    if "scores" not in data:
        raise ParseError(f"reply has no 'scores' (keys: {sorted(data)})")
    return _judgment(data, rubric_ids)


def parse_group(text: str, rubric_ids: list[str], labels: list[str]) -> dict[str, Judgment]:
    """Per trajectory label, what the model said; labels it did not cover are absent."""
    data = extract_json(text)
    entries = data.get("trajectories")
    if isinstance(entries, dict):
        entries = [{"id": k, **v} for k, v in entries.items() if isinstance(v, dict)]
    if not isinstance(entries, list):
        raise ParseError(f"reply has no 'trajectories' list (keys: {sorted(data)})")
    result: dict[str, Judgment] = {}
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("id", entry.get("label", ""))) in labels:
            result[str(entry.get("id", entry.get("label")))] = _judgment(entry, rubric_ids)
    return result
