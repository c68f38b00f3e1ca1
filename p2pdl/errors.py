"""Errors shared by every layer of p2pdl.

Errors are split by whose fault they are, in the manner of h11:

* :class:`LocalProtocolError` -- this program misused an API or tried to send
  something the protocol forbids (a frame over the hard limit, say).
* :class:`RemoteProtocolError` -- the remote peer sent something malformed,
  oversized, wrongly typed or otherwise against the spec.  The stream it came
  on is reset; nothing else is affected.

The others describe the outcome of an operation against a peer.  This module
imports nothing from p2pdl, so every layer may import it.
"""

from __future__ import annotations

__all__ = [
    "P2PDLError",
    "ConfigError",
    "IdentityError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "PeerUnreachableError",
    "ProtocolNotSupportedError",
    "StreamClosedError",
    "CallTimeoutError",
    "RemoteError",
    "NodeClosedError",
    "RequestError",
    "MatchmakingFailedError",
    "CheckpointError",
    "TaskError",
]


class P2PDLError(Exception):
    """Base class of every error p2pdl raises on purpose."""


class ConfigError(P2PDLError, ValueError):
    """A configuration value or user argument is invalid; the message says which."""


class TaskError(P2PDLError):
    """A user's training task (``p2pdl train --task``) cannot be loaded, lacks
    part of the task protocol, or raised: the message names the task, the
    function and what went wrong."""


class IdentityError(P2PDLError):
    """The identity file cannot be read, parsed or created.

    A corrupt identity file is never replaced silently: the peer id is part of
    the node's reputation and of every signed record it wrote.
    """


class LocalProtocolError(P2PDLError):
    """This program tried to do something the protocol does not allow."""


class RemoteProtocolError(P2PDLError):
    """The remote peer violated the protocol (malformed, oversized, wrong type...)."""


class PeerUnreachableError(P2PDLError):
    """No connection to the peer could be established."""


class ProtocolNotSupportedError(P2PDLError):
    """The peer is reachable but does not speak the requested protocol."""


class StreamClosedError(P2PDLError):
    """The stream ended (closed or reset by the peer, or the connection dropped)."""


class CallTimeoutError(P2PDLError, TimeoutError):
    """A bounded operation did not finish within its timeout."""


class RemoteError(P2PDLError):
    """The peer received the request and answered with an error reply.

    ``code`` is a short machine-readable string (see protocols/wire.md), and
    ``message`` a human-readable explanation written by the remote peer.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class NodeClosedError(P2PDLError):
    """The node was shut down; no further operations are possible."""


class RequestError(P2PDLError):
    """Raised by an RPC handler to answer the request with an error reply.

    The caller receives it as :class:`RemoteError` with the same ``code`` and
    ``message``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class MatchmakingFailedError(P2PDLError):
    """This peer is in no averaging group for the round (p2pdl.averaging).

    Raised by ``node.matchmaking.form_group`` when no group that includes this
    peer formed within ``matchmaking_time``, or the group it could form was
    smaller than ``min_group_size``.  The round failed for this peer only;
    the message says why.
    """


class CheckpointError(P2PDLError):
    """A checkpoint cannot be written, or no intact checkpoint can be read.

    The message says which file and why (missing, torn, checksum mismatch,
    unreadable).  Loading leaves damaged files as they are, for inspection.
    """


class StateSyncError(P2PDLError):
    """No training state could be downloaded from the donors (p2pdl.training).

    Raised by ``node.statesync.fetch`` when no donor offers state for the
    run at the asked epoch or newer, or every donor failed before all chunks
    arrived verified.  Chunks already verified are kept, so a later fetch of
    the same state resumes; the message says which donors failed and why.
    """
