"""The settings every component honours, defined once (ARCHITECTURE.md, settings table).

Read once in a process's `main()` and passed down; nothing here runs at import time.
Only the bootstrap address and the ClickHouse URL differ between embedded and at-scale runs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_BROKER_HOST = "127.0.0.1"
# 19092 rather than 9092 so the embedded broker never collides with a real Kafka on the same machine.
DEFAULT_BROKER_PORT = 19092
DEFAULT_BOOTSTRAP = f"{DEFAULT_BROKER_HOST}:{DEFAULT_BROKER_PORT}"


class Settings(BaseSettings):
    """Shared settings. Environment: `AGENTSTREAM_<FIELD>`; CLI options override the environment."""

    model_config = SettingsConfigDict(env_prefix="AGENTSTREAM_", extra="ignore", frozen=True)

    bootstrap_servers: str = Field(DEFAULT_BOOTSTRAP, description="Kafka bootstrap address")
    clickhouse_url: str | None = Field(None, description="chdb:///path or http://host:8123")
    data_dir: Path = Field(Path(".agentstream"), description="local state directory")

    @property
    def resolved_clickhouse_url(self) -> str:
        """The ClickHouse URL, defaulting to chDB under the data directory."""
        if self.clickhouse_url:
            return self.clickhouse_url
        return f"chdb://{(self.data_dir / 'clickhouse').resolve()}"

    @classmethod
    def from_args(cls, args: object) -> Settings:
        """Settings from parsed CLI args (which already fell back to the environment)."""
        given = {
            name: getattr(args, name)
            for name in ("bootstrap_servers", "clickhouse_url", "data_dir")
            if getattr(args, name, None) is not None
        }
        return cls(**given)
