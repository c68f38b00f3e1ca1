"""Run policies and the membership table: who may touch which run.  Sans-IO.

A node has a policy for each run it guards (:class:`OpenRun`,
:class:`AllowlistRun`, :class:`CertificateRun`); a run without one is open,
as before membership existed.  The :class:`MembershipTable` answers the
admission gate's questions from what it holds (the policies, the
certificates it has checked, the newest revocation list of each run); time
is an argument, and it never waits.  Membership is always asked of the peer
the connection authenticated (Noise), never of a claim in a message.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pathlib
from collections.abc import Iterable

from libp2p.peer.id import ID

from ..errors import ConfigError
from ..service import NOT_ADMITTED, Refusal, Role, check_run_id
from ._certificates import Certificate, RevocationList, peer_id_problem
from .config import MAX_ALLOWLIST_PEERS, MAX_FILE_SIZE, MembershipConfig

__all__ = ["OpenRun", "AllowlistRun", "CertificateRun", "RunPolicy", "Member",
           "MembershipTable", "REFUSAL_REASON"]

logger = logging.getLogger(__name__)

#: What a refused peer is told, whatever the cause: it says nothing about the run.
REFUSAL_REASON = "not a member of this run"
#: What a monitor is told when it asks to average.
MONITOR_REASON = "monitors do not average"
#: Runs logged as open (each once).
MAX_LOGGED_OPEN_RUNS = 1024


@dataclasses.dataclass(frozen=True)
class OpenRun:
    """A run anyone who knows its id may join (the default for a run with no policy)."""

    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    @property
    def mode(self) -> str:
        return "open"


@dataclasses.dataclass(frozen=True)
class AllowlistRun:
    """A run only the listed peers (base58 peer ids) may touch; roles are not bound."""

    run_id: str
    peers: frozenset[str]

    def __init__(self, run_id: str, peers: Iterable[ID | str]) -> None:
        texts = frozenset(p.to_base58() if isinstance(p, ID) else p for p in peers)
        if len(texts) > MAX_ALLOWLIST_PEERS:
            raise ConfigError(f"an allowlist names at most {MAX_ALLOWLIST_PEERS} peers")
        for text in texts:
            problem = peer_id_problem(text)
            if problem:
                raise ConfigError(f"allowlist of {run_id!r}: {problem}")
        object.__setattr__(self, "run_id", check_run_id(run_id))
        object.__setattr__(self, "peers", texts)

    @classmethod
    def load(cls, run_id: str, path: str | os.PathLike[str]) -> AllowlistRun:
        """An allowlist from a file: one peer id per line; ``#`` starts a comment."""
        path = pathlib.Path(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_SIZE + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read the allowlist {path}: {exc.strerror}") from None
        if len(raw) > MAX_FILE_SIZE:
            raise ConfigError(f"the allowlist {path} is larger than {MAX_FILE_SIZE} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"the allowlist {path} is not UTF-8 text") from None
        peers = []
        for number, line in enumerate(text.splitlines(), 1):
            entry = line.split("#", 1)[0].strip()
            if not entry:
                continue
            problem = peer_id_problem(entry)
            if problem:
                raise ConfigError(f"{path}:{number}: {problem}")
            peers.append(entry)
        return cls(run_id, peers)

    @property
    def mode(self) -> str:
        return "allowlist"


@dataclasses.dataclass(frozen=True)
class CertificateRun:
    """A run whose members show a certificate signed by ``authority`` (its id).

    ``certificate``: this node's own (a :class:`Certificate` or the path of
    its file), or None for a node that serves the run without being a member
    (a bootstrap node that only checks others).  ``revocations``: a
    :class:`RevocationList` (or its file) to obey from the start.
    """

    run_id: str
    authority: str
    certificate: Certificate | None = None
    revocations: RevocationList | None = None

    def __init__(self, run_id: str, authority: str | object,
                 certificate: Certificate | str | os.PathLike[str] | None = None,
                 revocations: RevocationList | str | os.PathLike[str] | None = None) -> None:
        check_run_id(run_id)
        authority_id = getattr(authority, "id", authority)  # an Authority works too
        problem = peer_id_problem(authority_id)
        if problem:
            raise ConfigError(f"authority of {run_id!r}: {problem}")
        if certificate is not None and not isinstance(certificate, Certificate):
            certificate = Certificate.load(certificate)
        if revocations is not None and not isinstance(revocations, RevocationList):
            revocations = RevocationList.load(revocations)
        if certificate is not None and (certificate.run_id != run_id
                                        or certificate.authority != authority_id):
            raise ConfigError(f"the certificate is for run {certificate.run_id!r} under "
                              f"authority {certificate.authority}, not run {run_id!r} under "
                              f"{authority_id}")
        if revocations is not None and revocations.problem(authority_id, run_id,
                                                           revocations.issued_at) is not None:
            raise ConfigError(f"the revocation list is not {authority_id}'s for {run_id!r}")
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "authority", authority_id)
        object.__setattr__(self, "certificate", certificate)
        object.__setattr__(self, "revocations", revocations)

    @property
    def mode(self) -> str:
        return "certificate"


RunPolicy = OpenRun | AllowlistRun | CertificateRun


@dataclasses.dataclass(frozen=True)
class Member:
    """A member as this node knows it: its role and the end of its certificate
    (None for allowlist members, whose roles and times are not bound)."""

    role: Role | None
    expires_at: float | None


class _CertificateRunState:
    """What a node holds of one certificate run: members' certificates, the newest list."""

    def __init__(self, policy: CertificateRun, max_members: int) -> None:
        self.policy = policy
        self.max_members = max_members
        self.members: collections.OrderedDict[str, Certificate] = collections.OrderedDict()
        self.revocations: RevocationList | None = policy.revocations
        self.revoked: frozenset[int] = (policy.revocations.serials
                                        if policy.revocations else frozenset())

    @property
    def sequence(self) -> int:
        return -1 if self.revocations is None else self.revocations.sequence


class MembershipTable:
    """The runs' policies and what this node has checked.  The gate's sans-IO core.

    Args:
        peer_id: this node's peer id (its own certificates must name it).
        config: :class:`MembershipConfig` (clock skew, bounds).
        averaging_protocols: protocol ids a monitor is refused on.
    """

    def __init__(self, peer_id: ID, config: MembershipConfig | None = None,
                 averaging_protocols: Iterable[str] = ()) -> None:
        self.peer_id = peer_id
        self.config = config or MembershipConfig()
        self.averaging_protocols = frozenset(averaging_protocols)
        self._policies: dict[str, RunPolicy] = {}
        self._certified: dict[str, _CertificateRunState] = {}
        self._logged_open: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.counters: collections.Counter[str] = collections.Counter()

    # -- policies ----------------------------------------------------------------------

    def add_run(self, policy: RunPolicy, now: float) -> None:
        """Guard ``policy.run_id`` by ``policy`` (replacing an earlier policy of that run)."""
        if not isinstance(policy, (OpenRun, AllowlistRun, CertificateRun)):
            raise ConfigError(f"a run policy is an OpenRun, AllowlistRun or CertificateRun, "
                              f"not {type(policy).__name__}")
        run_id = policy.run_id
        if run_id not in self._policies and len(self._policies) >= self.config.max_runs:
            raise ConfigError(f"this node guards at most {self.config.max_runs} runs "
                              f"(MembershipConfig.max_runs)")
        if isinstance(policy, CertificateRun) and policy.certificate is not None:
            problem = policy.certificate.problem(policy.authority, run_id, self.peer_id, now,
                                                 self.config.allowed_clock_skew)
            if problem == "for another peer":
                raise ConfigError(f"the certificate of run {run_id!r} is for "
                                  f"{policy.certificate.peer_id}, not this node ({self.peer_id})")
            if problem is not None:
                logger.warning("run %s: this node's own certificate is not valid now (%s)",
                               run_id, problem)
        old = self._certified.pop(run_id, None)
        self._policies[run_id] = policy
        if isinstance(policy, CertificateRun):
            state = _CertificateRunState(policy, self.config.max_members)
            if old is not None and old.policy.authority == policy.authority:
                state.members = old.members
                if old.sequence > state.sequence:
                    state.revocations, state.revoked = old.revocations, old.revoked
            self._certified[run_id] = state
        logger.info("run %s: %s", run_id, _describe(policy))

    def policy(self, run_id: str) -> RunPolicy | None:
        return self._policies.get(run_id)

    def policies(self) -> tuple[RunPolicy, ...]:
        return tuple(self._policies.values())

    def has_policy(self, run_id: str) -> bool:
        return run_id in self._policies

    def needs_introduction(self, run_id: str) -> bool:
        """Whether peers of ``run_id`` show certificates (a certificate run here)."""
        return run_id in self._certified

    # -- the gate ---------------------------------------------------------------------

    def admit(self, peer: ID, protocol_id: str, run_id: str | None,
              now: float) -> Refusal | None:
        if run_id is None:
            return None
        policy = self._policies.get(run_id)
        if policy is None or isinstance(policy, OpenRun):
            if policy is None:
                self._log_open(run_id)
            return None
        if not self.is_member(peer, run_id, now):
            self.counters["refused"] += 1
            return Refusal(REFUSAL_REASON, NOT_ADMITTED)
        if (protocol_id in self.averaging_protocols
                and self.role_of(peer, run_id, now) is Role.MONITOR):
            self.counters["refused_monitors"] += 1
            return Refusal(MONITOR_REASON, NOT_ADMITTED)
        return None

    def is_member(self, peer: ID, run_id: str, now: float) -> bool:
        policy = self._policies.get(run_id)
        if policy is None or isinstance(policy, OpenRun):
            return True
        if isinstance(policy, AllowlistRun):
            return _text(peer) in policy.peers
        return self._valid_certificate(peer, run_id, now) is not None

    def role_of(self, peer: ID, run_id: str, now: float) -> Role | None:
        certificate = self._valid_certificate(peer, run_id, now)
        return None if certificate is None else certificate.role

    def _valid_certificate(self, peer: ID, run_id: str, now: float) -> Certificate | None:
        state = self._certified.get(run_id)
        if state is None:
            return None
        text = _text(peer)
        if text == self.peer_id.to_base58():
            certificate = state.policy.certificate
        else:
            certificate = state.members.get(text)
        if certificate is None or certificate.serial in state.revoked:
            return None
        if now >= certificate.expires_at + self.config.allowed_clock_skew:
            return None
        return certificate

    def credential(self, run_id: str) -> bytes | None:
        """This node's certificate of ``run_id`` (encoded), or None."""
        state = self._certified.get(run_id)
        if state is None or state.policy.certificate is None:
            return None
        return state.policy.certificate.to_bytes()

    def own_certificate(self, run_id: str) -> Certificate | None:
        state = self._certified.get(run_id)
        return None if state is None else state.policy.certificate

    # -- what peers show -----------------------------------------------------------------

    def offer_certificate(self, peer: ID, run_id: str, certificate: Certificate | bytes,
                          now: float) -> str | None:
        """Check ``peer``'s certificate of ``run_id``; record it when it is valid.

        Returns why it was not accepted (None: ``peer`` is now a member).
        Raises :class:`RemoteProtocolError` for bytes that are no certificate.
        """
        state = self._certified.get(run_id)
        if state is None:
            return "this node has no certificate policy for the run"
        if not isinstance(certificate, Certificate):
            certificate = Certificate.from_bytes(certificate)
        problem = certificate.problem(state.policy.authority, run_id, peer, now,
                                      self.config.allowed_clock_skew)
        if problem is None and certificate.serial in state.revoked:
            problem = "revoked"
        if problem is not None:
            self.counters["certificates_refused"] += 1
            return problem
        text = _text(peer)
        held = state.members.get(text)
        if held is None or held.expires_at <= certificate.expires_at:
            state.members[text] = certificate
        state.members.move_to_end(text)
        while len(state.members) > state.max_members:
            state.members.popitem(last=False)
        self.counters["certificates_accepted"] += 1
        return None

    def offer_revocations(self, revocations: RevocationList | bytes, now: float) -> str | None:
        """Obey ``revocations`` when it is its run authority's and newer than the one
        held.  Returns why not (``"not newer"`` for one already known), None when
        it was taken.  Raises :class:`RemoteProtocolError` for bytes that are no list."""
        if not isinstance(revocations, RevocationList):
            revocations = RevocationList.from_bytes(revocations)
        state = self._certified.get(revocations.run_id)
        if state is None:
            return "this node has no certificate policy for the run"
        problem = revocations.problem(state.policy.authority, state.policy.run_id, now,
                                      self.config.allowed_clock_skew)
        if problem is not None:
            self.counters["revocations_refused"] += 1
            return problem
        if revocations.sequence <= state.sequence:
            return "not newer"
        state.revocations = revocations
        state.revoked = revocations.serials
        self.counters["revocations_accepted"] += 1
        for text in [t for t, c in state.members.items() if c.serial in state.revoked]:
            del state.members[text]
        logger.info("run %s: obeying revocation list %d (%d serials)", revocations.run_id,
                    revocations.sequence, len(revocations.serials))
        own = state.policy.certificate
        if own is not None and own.serial in state.revoked:
            logger.warning("run %s: this node's own certificate is revoked", revocations.run_id)
        return None

    def revocation_sequence(self, run_id: str) -> int:
        """Sequence of the list obeyed for ``run_id`` (-1: none)."""
        state = self._certified.get(run_id)
        return -1 if state is None else state.sequence

    def revocations(self, run_id: str) -> RevocationList | None:
        state = self._certified.get(run_id)
        return None if state is None else state.revocations

    # -- what users read -----------------------------------------------------------------

    def members(self, run_id: str, now: float) -> dict[str, Member]:
        """Members of ``run_id`` this node knows now (base58 id -> :class:`Member`).

        An allowlist run: the list.  A certificate run: the peers whose valid,
        unrevoked certificates it has seen, and itself if it holds one.  An
        open run (or one without a policy): nobody is known, everyone is admitted.
        """
        policy = self._policies.get(run_id)
        if isinstance(policy, AllowlistRun):
            return {p: Member(None, None) for p in sorted(policy.peers)}
        state = self._certified.get(run_id)
        if state is None:
            return {}
        out = {}
        candidates = dict(state.members)
        if state.policy.certificate is not None:
            candidates[self.peer_id.to_base58()] = state.policy.certificate
        for text in candidates:
            certificate = self._valid_certificate(ID.from_base58(text), run_id, now)
            if certificate is not None:
                out[text] = Member(certificate.role, certificate.expires_at)
        return out

    def member_count(self) -> int:
        return sum(len(s.members) for s in self._certified.values())

    def _log_open(self, run_id: str) -> None:
        if run_id in self._logged_open:
            return
        self._logged_open[run_id] = None
        if len(self._logged_open) > MAX_LOGGED_OPEN_RUNS:
            self._logged_open.popitem(last=False)
        logger.info("run %s is open: this node has no policy for it, so anyone who knows "
                    "its id is admitted", run_id)


def _text(peer: ID | str) -> str:
    return peer.to_base58() if isinstance(peer, ID) else str(peer)


def _describe(policy: RunPolicy) -> str:
    if isinstance(policy, OpenRun):
        return "open: anyone who knows its id is admitted"
    if isinstance(policy, AllowlistRun):
        return f"allowlist of {len(policy.peers)} peers"
    own = "with" if policy.certificate is not None else "without"
    return f"certificates of authority {policy.authority} ({own} a certificate of this node)"

