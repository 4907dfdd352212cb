"""Versioned schema migrations: `migrations/NNNN_name.sql`, applied in order, each once.

Every statement is idempotent (`IF NOT EXISTS`), so a migration interrupted half-way is simply
applied again. Applied versions are recorded in `agentstream.schema_migrations` with a checksum; a
changed file that was already applied is reported, never silently re-run. Optional raw-event TTL:
`apply_events_ttl(client, days)`.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from clients.clickhouse import DATABASE, ClickHouseError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
MIGRATIONS_TABLE = f"{DATABASE}.schema_migrations"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    def statements(self) -> list[str]:
        return split_statements(self.sql)


def split_statements(sql: str) -> list[str]:
    """Split a migration file on `;` at line ends, dropping `--` comment lines.

    >>> split_statements("-- hi\\nCREATE TABLE a (x UInt8) ENGINE = Memory;\\n\\nSELECT 1;\\n")
    ['CREATE TABLE a (x UInt8) ENGINE = Memory', 'SELECT 1']
    """
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    chunks = re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE)
    return [chunk.strip() for chunk in chunks if chunk.strip()]


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file in `directory`, in version order."""
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise ClickHouseError(f"migration file {path.name!r}: name must look like 0001_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ClickHouseError(f"migrations in {directory}: duplicate version numbers {versions}")
    return found


def applied_versions(client) -> dict[int, str]:
    """version -> checksum of every migration already applied."""
    rows = client.query(
        f"SELECT version, argMax(checksum, applied_at) FROM {MIGRATIONS_TABLE} GROUP BY version"
    )
    return {int(v): c for v, c in rows.result_rows}


def migrate(client, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply every pending migration; returns the versions applied now (empty when up to date)."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version UInt32, name String, checksum String, "
        "applied_at DateTime64(3, 'UTC')) ENGINE = ReplacingMergeTree(applied_at) ORDER BY version"
    )
    done = applied_versions(client)
    applied = []
    for migration in load_migrations(directory):
        if migration.version in done:
            if done[migration.version] != migration.checksum:
                log.warning(
                    "migration %04d_%s changed after it was applied (checksum %s, applied %s); "
                    "add a new migration instead of editing it",
                    migration.version,
                    migration.name,
                    migration.checksum,
                    done[migration.version],
                )
            continue
        _apply(client, migration)
        applied.append(migration.version)
    return applied


def _apply(client, migration: Migration) -> None:
    log.info("applying migration %04d_%s", migration.version, migration.name)
    for statement in migration.statements():
        try:
            client.command(statement)
        except Exception as exc:
            name = f"{migration.version:04d}_{migration.name}"
            raise ClickHouseError(f"migration {name}: statement failed ({exc}):\n{statement[:300]}") from exc
    client.insert(
        MIGRATIONS_TABLE,
        [[migration.version, migration.name, migration.checksum, datetime.now(UTC)]],
        column_names=["version", "name", "checksum", "applied_at"],
    )


def apply_events_ttl(client, days: int | None) -> None:
    """Expire raw `events` rows after `days` days (typed tables keep everything); None removes it."""
    if days is None or days <= 0:
        if "TTL" in str(client.command(f"SHOW CREATE TABLE {DATABASE}.events")):
            client.command(f"ALTER TABLE {DATABASE}.events REMOVE TTL")
        return
    client.command(
        f"ALTER TABLE {DATABASE}.events MODIFY TTL toDateTime(occurred_at) + INTERVAL {int(days)} DAY"
    )
