"""The console's configuration: documented fields are `agentstream console` options."""

from __future__ import annotations

from dataclasses import dataclass

from infra.errors import ConsoleError
from producers.gateway.requests import check_key_hashes, parse_key_hashes
from schemas.config_fields import option

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
    host: str = option("127.0.0.1", "address to bind (loopback unless you mean it)")
    port: int = option(8090, "port to bind (0: any free port)")
    api_key_hashes: frozenset[str] | tuple[str, ...] = option(
        (),
        "comma-separated sha256 hex digests of the API keys that may read the console (the "
        "gateway's; `agentstream gateway-key KEY`)",
        env="AGENTSTREAM_GATEWAY_API_KEY_HASHES",
    )
    allow_anonymous: bool = option(False, "serve a non-loopback address without API keys")
    allowed_hosts: tuple[str, ...] = option(
        (),
        "Host header names (host or host:port, comma-separated) the console answers besides "
        "127.0.0.1, localhost and [::1] and the address it binds; any other Host gets 421 (DNS "
        "rebinding)",
        env="AGENTSTREAM_CONSOLE_ALLOWED_HOSTS",
    )
    header_timeout_s: float = option(
        10.0,
        "a connection must send a complete request head within this many seconds of opening (or of "
        "the previous response), or it is closed",
        env="AGENTSTREAM_CONSOLE_HEADER_TIMEOUT_S",
    )
    page_size: int = option(50, "trajectories per page")
    refresh_s: float = option(2.0, "the overview refreshes this often (seconds)")
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
        object.__setattr__(
            self, "allowed_hosts", tuple(h.strip().lower() for h in self.allowed_hosts if h.strip())
        )
        for entry in self.allowed_hosts:
            if split_host(entry) is None:
                raise ConsoleError(f"allowed_hosts: {entry!r} is not a host name or host:port")
        if not 0 < self.header_timeout_s <= 300:
            raise ConsoleError(f"header_timeout_s={self.header_timeout_s!r}: must be in (0, 300]")
        if not 1 <= self.page_size <= 200:
            raise ConsoleError(f"page_size={self.page_size!r}: must be from 1 to 200")
        if self.refresh_s <= 0:
            raise ConsoleError(f"refresh_s={self.refresh_s!r}: must be positive")

    @property
    def keys_required(self) -> bool:
        return bool(self.api_key_hashes)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's Host header names this console: a loopback name, the address it
        binds (unless a wildcard), or one of `allowed_hosts`. A page on another site that rebinds
        its own name to 127.0.0.1 still sends its own name, so it is refused.

        >>> c = ConsoleConfig("chdb:///x", "b:1", allowed_hosts=("console.example.com",))
        >>> [c.host_allowed(h) for h in ("127.0.0.1:8090", "[::1]:8090", "LOCALHOST", "console.example.com")]
        [True, True, True, True]
        >>> [c.host_allowed(h) for h in ("evil.example:8090", "127.0.0.1.evil.example", "", None)]
        [False, False, False, False]
        """
        given = split_host(header or "")
        if given is None:
            return False
        name, port = given
        if name in LOOPBACK or (name == self.host.lower() and name not in WILDCARDS):
            return True
        for entry in self.allowed_hosts:
            allowed_name, allowed_port = split_host(entry) or ("", None)
            if name == allowed_name and (allowed_port is None or allowed_port == port):
                return True
        return False


WILDCARDS = ("0.0.0.0", "::", "")


def split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header value, the name lower-case without brackets or a final dot;
    None when it is not one.

    >>> split_host("[::1]:8090"), split_host("Example.COM."), split_host("a b"), split_host("x:99999")
    (('::1', 8090), ('example.com', None), None, None)
    """
    from urllib.parse import urlsplit

    if not value or any(c in value for c in " /?#@\\\t\r\n"):
        return None
    try:
        parts = urlsplit("//" + value)
        port = parts.port
    except ValueError:
        return None
    name = (parts.hostname or "").rstrip(".")
    return (name, port) if name else None
