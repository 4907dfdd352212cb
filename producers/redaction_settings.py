"""The `redaction:` section of the settings file, read into the process's `Redactor` (issue #18).

A bad settings file is a `ProducerError` naming the file, the field and the value. The only I/O is
reading the settings file in `load_settings`.

Settings file (YAML; `AGENTSTREAM_SETTINGS_FILE`, else `<data dir>/settings.yaml` when it exists):

    redaction:
      enabled: true            # default true
      detectors:               # every built-in detector is on unless set to false here
        email: false
      patterns:                # your own: a name ([a-z0-9_]+) and a Python regex
        - name: ticket
          regex: "TICKET-[0-9]{6}"
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producers.errors import ProducerError
from producers.redaction import BUILTIN_DETECTORS, BUILTIN_NAMES, Detector, Redactor
from schemas.config_fields import option

SETTINGS_FILE_ENV = "AGENTSTREAM_SETTINGS_FILE"
SETTINGS_FILE_NAME = "settings.yaml"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class RedactionSettings:
    """The `redaction:` section: on/off, built-in detectors turned off, user patterns (name, regex)."""

    enabled: bool = True
    disabled: frozenset[str] = frozenset()
    patterns: tuple[tuple[str, str], ...] = ()
    source: str = field(default="(defaults)", compare=False)

    def redactor(self) -> Redactor:
        """Built-in detectors not turned off, then the user patterns, in the file's order."""
        chosen = [d for d in BUILTIN_DETECTORS if d.name not in self.disabled]
        chosen += [Detector(name, re.compile(regex)) for name, regex in self.patterns]
        return Redactor(chosen, self.enabled)


def settings_file_option() -> Any:
    """The `settings_file` field of a command's config (ingest, the gateway): one help, one env."""
    return option(
        None,
        f"YAML settings file (its `redaction:` section); default <data dir>/{SETTINGS_FILE_NAME} "
        "when it exists",
        env=SETTINGS_FILE_ENV,
    )


def settings_file(explicit: str | Path | None = None, data_dir: str | Path | None = None) -> Path | None:
    """Which settings file applies: `explicit`, else `$AGENTSTREAM_SETTINGS_FILE`, else
    `<data_dir>/settings.yaml` when it exists, else None (built-in defaults). A file named
    explicitly or by the environment must exist."""
    named = explicit or os.environ.get(SETTINGS_FILE_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise ProducerError(f"settings file {str(path)!r} does not exist (or is not a file)")
        return path
    if data_dir is not None and (Path(data_dir) / SETTINGS_FILE_NAME).is_file():
        return Path(data_dir) / SETTINGS_FILE_NAME
    return None


def load_settings(path: Path | None) -> RedactionSettings:
    """The `redaction:` section of the YAML file at `path` (None: defaults)."""
    if path is None:
        return RedactionSettings()
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProducerError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ProducerError(f"{path}: expected a mapping at the top, got {type(doc).__name__}")
    return parse_section(doc.get("redaction") or {}, str(path))


def parse_section(section: Any, source: str = "settings") -> RedactionSettings:
    """Check and read a `redaction:` mapping; errors name `source`, the field and the value."""

    def bad(field_: str, value: Any, expected: str) -> ProducerError:
        return ProducerError(f"{source}: redaction.{field_}: {expected}, got {value!r}")

    if not isinstance(section, dict):
        raise bad("", section, "expected a mapping")
    unknown = sorted(set(section) - {"enabled", "detectors", "patterns"})
    if unknown:
        raise bad(unknown[0], section[unknown[0]], "unknown key (known: enabled, detectors, patterns)")
    enabled = section.get("enabled", True)
    if not isinstance(enabled, bool):
        raise bad("enabled", enabled, "expected true or false")
    return RedactionSettings(
        enabled,
        _disabled(section.get("detectors") or {}, bad),
        _patterns(section.get("patterns") or [], bad),
        source,
    )


def _disabled(detectors: Any, bad) -> frozenset[str]:
    if not isinstance(detectors, dict):
        raise bad("detectors", detectors, "expected a mapping of detector name -> true/false")
    for name, on in detectors.items():
        if name not in BUILTIN_NAMES:
            raise bad(f"detectors.{name}", name, f"unknown detector (known: {', '.join(BUILTIN_NAMES)})")
        if not isinstance(on, bool):
            raise bad(f"detectors.{name}", on, "expected true or false")
    return frozenset(name for name, on in detectors.items() if not on)


def _patterns(patterns: Any, bad) -> tuple[tuple[str, str], ...]:
    if not isinstance(patterns, list):
        raise bad("patterns", patterns, "expected a list of {name, regex}")
    out = []
    for i, item in enumerate(patterns):
        if not isinstance(item, dict) or set(item) != {"name", "regex"}:
            raise bad(f"patterns[{i}]", item, "expected a mapping with exactly the keys name and regex")
        name, regex = item["name"], item["regex"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad(
                f"patterns[{i}].name", name, "expected a lower-case name of [a-z0-9_] starting with a letter"
            )
        if not isinstance(regex, str) or not regex:
            raise bad(f"patterns[{i}].regex", regex, "expected a non-empty regular expression")
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise bad(f"patterns[{i}].regex", regex, f"not a valid regular expression ({exc})") from None
        if compiled.match(""):
            raise bad(f"patterns[{i}].regex", regex, "matches the empty string")
        out.append((name, regex))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _cached(path: Path | None) -> Redactor:
    return load_settings(path).redactor()


def load_redactor(explicit: str | Path | None = None, data_dir: str | Path | None = None) -> Redactor:
    """The process's redactor for the settings file that applies (see `settings_file`), built
    once per file and shared by every producer in the process."""
    path = settings_file(explicit, data_dir)
    return _cached(path.resolve() if path is not None else None)
