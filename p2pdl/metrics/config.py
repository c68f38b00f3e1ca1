"""The metrics server's settings; every default documented here."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError

__all__ = ["MetricsConfig", "MAX_CONNECTIONS"]

#: The most HTTP connections a config may allow at once.
MAX_CONNECTIONS = 256


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """How ``/metrics`` (and the monitor's dashboard) is served.

    Attributes:
        max_connections: HTTP connections served at once; one more is
            answered 503 and closed.  Default 8 (a scraper or two).
        request_timeout: seconds a connection may take to send a whole
            request (and to take the answer); then it is closed.  Default 10.
        max_request_bytes: the most bytes of a request's line and headers;
            a longer one is answered 431 and closed.  Default 8192.
        max_requests_per_connection: requests served on one keep-alive
            connection before it is closed.  Default 100.
    """

    max_connections: int = 8
    request_timeout: float = 10.0
    max_request_bytes: int = 8192
    max_requests_per_connection: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise ConfigError(f"max_connections must be 1..{MAX_CONNECTIONS}")
        if not 0 < self.request_timeout <= 3600:
            raise ConfigError("request_timeout must be in (0, 3600] seconds")
        if not 256 <= self.max_request_bytes <= 1 << 20:
            raise ConfigError("max_request_bytes must be 256..1048576")
        if not 1 <= self.max_requests_per_connection <= 10_000:
            raise ConfigError("max_requests_per_connection must be 1..10000")
