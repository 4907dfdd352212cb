"""The console's configuration: documented fields are `agentstream console` options."""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.errors import ConsoleError
from producers.gateway_requests import check_key_hashes, parse_key_hashes

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ConsoleConfig:
    """Where the console listens, what it reads and who may read it.

    The API-key rules are the gateway's: the same hashes (`agentstream gateway-key KEY`, env
    AGENTSTREAM_GATEWAY_API_KEY_HASHES) are accepted. On a loopback address the console needs no key
    unless hashes are given; on any other address it refuses to start without them, unless
    `--allow-anonymous` says so on purpose."""

    clickhouse_url: str
    bootstrap_servers: str
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind (loopback unless you mean it)"})
    port: int = field(default=8090, metadata={"help": "port to bind (0: any free port)"})
    api_key_hashes: frozenset[str] | tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "comma-separated sha256 hex digests of the API keys that may read the console "
            "(the gateway's; `agentstream gateway-key KEY`)",
            "env": "AGENTSTREAM_GATEWAY_API_KEY_HASHES",
        },
    )
    allow_anonymous: bool = field(
        default=False, metadata={"help": "serve a non-loopback address without API keys"}
    )
    page_size: int = field(default=50, metadata={"help": "trajectories per page"})
    refresh_s: float = field(default=2.0, metadata={"help": "the overview refreshes this often (seconds)"})
    dead_letters_shown: int = 20

    def __post_init__(self):
        object.__setattr__(self, "api_key_hashes", parse_key_hashes(self.api_key_hashes))
        check_key_hashes(self.api_key_hashes)
        if self.host not in LOOPBACK and not self.api_key_hashes and not self.allow_anonymous:
            raise ConsoleError(
                f"host={self.host!r}: a console reachable beyond this machine needs API keys "
                "(--api-key-hashes or AGENTSTREAM_GATEWAY_API_KEY_HASHES); pass --allow-anonymous to "
                "expose it without on purpose"
            )
        if not 1 <= self.page_size <= 200:
            raise ConsoleError(f"page_size={self.page_size!r}: must be from 1 to 200")
        if self.refresh_s <= 0:
            raise ConsoleError(f"refresh_s={self.refresh_s!r}: must be positive")

    @property
    def keys_required(self) -> bool:
        return bool(self.api_key_hashes)
