"""Which version the server serves at start: the newest valid checkpoint under the executor's root.

The executor's layout (written by consumers/training/checkpoints.py; read here, not imported:
producers and consumers do not import each other): `<root>/<version>/` holds `adapter/` (LoRA) or
`model/` (a full fine-tune), `optimizer.pt`, and `state.json`, written after the weights, whose
`last_event` is the version's `policy.updated`; `<root>/latest` names the newest complete one and
is written last (the commit point). Versions are `v1`, `v2`, ..., ordered by their number
(`schemas.policy_versions.version_number`).

Candidates, newest first: the one `latest` names, then the older numbered directories that hold a
`state.json`, by number. A directory numbered above `latest`'s was never committed. The server
tries each in turn and serves the first it can load that was built on its base; each checkpoint it
leaves out is one error line naming it and why; when none is left, the base model. So a restart
never crash-loops on a bad checkpoint. Reading the root never raises.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from producers.errors import ProducerError
from producers.policy.engine.errors import one_line
from producers.policy.reload import other_base
from schemas.policy_versions import BASE_VERSION, version_number

log = logging.getLogger(__name__)

LATEST = "latest"
STATE = "state.json"
MAX_POINTER_BYTES = 256
MAX_STATE_BYTES = 64 * 1024 * 1024  # state.json lists every batch trained: large, not unbounded


@dataclass(frozen=True)
class Candidate:
    """A checkpoint to try at start, and the base its `policy.updated` says it was trained on."""

    version: str
    path: Path
    base_model_id: str = ""
    tokenizer_hash: str = ""


def start_candidates(root: str | Path) -> tuple[list[Candidate], list[str]]:
    """The checkpoints under `root` to try, newest first, and one line per checkpoint left out
    (naming it and why).

    A `latest` naming `v3` over directories v1 (complete), v2 (no state.json) and v4 (uncommitted)
    gives candidates v3, v1 and two lines: v4 never committed, v2 incomplete.
    """
    root = Path(root)
    if not root.is_dir():
        return [], []
    skipped: list[str] = []
    latest = _latest(root, skipped)
    bound = version_number(latest) if latest is not None else None
    found: list[tuple[int, str]] = []
    for entry in _entries(root, skipped):
        number = version_number(entry.name)
        if number is None or entry.name in (BASE_VERSION, latest) or not entry.is_dir():
            continue
        if bound is not None and number > bound:
            skipped.append(f"{entry.name} ({entry}): numbered above {LATEST} ({latest}), never committed")
        elif not (entry / STATE).is_file():
            skipped.append(f"{entry.name} ({entry}): no {STATE}, an incomplete checkpoint")
        else:
            found.append((number, entry.name))
    # `latest` naming `base`: the executor went back to the base model (a version refused by its gate)
    head = [latest] if latest not in (None, BASE_VERSION) else []
    names = head + [name for _, name in sorted(found, reverse=True)]
    candidates = []
    for name in names:
        try:
            candidates.append(_candidate(root / name))
        except ProducerError as exc:
            skipped.append(f"{name} ({root / name}): {exc}")
    return candidates, skipped


def serve_newest(engine, root: str | Path):
    """`engine` (the base model) serving the newest valid checkpoint under `root`: the first
    candidate built on its base that loads (`engine.with_checkpoint`); `engine` itself when none."""
    candidates, skipped = start_candidates(root)
    for line in skipped:
        log.error("policy start: checkpoint %s; skipped", line)
    for candidate in candidates:
        refusal = other_base(engine, candidate.base_model_id, candidate.tokenizer_hash)
        if refusal is not None:
            log.error(
                "policy start: checkpoint %s (%s): %s; skipped", candidate.version, candidate.path, refusal
            )
            continue
        try:
            return engine.with_checkpoint(candidate.path, candidate.version)
        except Exception as exc:  # whatever is on disk, the server starts
            reason = str(exc) if isinstance(exc, ProducerError) else one_line(exc)
            log.error(
                "policy start: checkpoint %s (%s) not served: %s; skipped",
                candidate.version,
                candidate.path,
                reason,
            )
    if candidates or skipped:
        log.warning("policy start: no checkpoint under %s could be served; serving %s", root, engine.version)
    return engine


def _latest(root: Path, skipped: list[str]) -> str | None:
    """The directory name `latest` holds, when it names an existing directory of `root`."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    try:
        with pointer.open("rb") as handle:
            name = handle.read(MAX_POINTER_BYTES + 1).decode().strip()
    except (OSError, UnicodeDecodeError) as exc:
        skipped.append(f"{LATEST} ({pointer}): unreadable: {one_line(exc)}")
        return None
    if not name or len(name) > MAX_POINTER_BYTES or "/" in name or "\\" in name or name in (".", ".."):
        skipped.append(f"{LATEST} ({pointer}): {name[:80]!r} is not a checkpoint directory's name")
        return None
    if not (root / name).is_dir():
        skipped.append(f"{name} ({root / name}): named by {LATEST} but not a directory")
        return None
    return name


def _entries(root: Path, skipped: list[str]) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError as exc:
        skipped.append(f"directory {root}: unreadable: {one_line(exc)}")
        return []


def _candidate(path: Path) -> Candidate:
    """The checkpoint in `path`, with the base its `state.json` names (none: not compared)."""
    state = path / STATE
    if not state.is_file():
        return Candidate(path.name, path)
    try:
        if state.stat().st_size > MAX_STATE_BYTES:
            raise ProducerError(f"{STATE}: over {MAX_STATE_BYTES} bytes")
        data = json.loads(state.read_bytes())
    except (OSError, ValueError) as exc:
        raise ProducerError(f"{STATE}: unreadable: {one_line(exc)}") from exc
    if not isinstance(data, dict):
        raise ProducerError(f"{STATE}: expected a JSON object, got {type(data).__name__}")
    event = data.get("last_event") or {}
    if not isinstance(event, dict):
        raise ProducerError(f"{STATE}: last_event: expected an object, got {type(event).__name__}")
    base = {key: event.get(key) or "" for key in ("base_model_id", "tokenizer_hash")}
    for key, value in base.items():
        if not isinstance(value, str):
            raise ProducerError(f"{STATE}: last_event.{key}: expected a string, got {value!r:.80}")
    return Candidate(path.name, path, **base)
