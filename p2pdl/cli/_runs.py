"""The run membership flags of ``p2pdl train`` and ``p2pdl node``, and what they build.

    --authority ID --certificate FILE   a certificate run: this peer's certificate,
                                        signed by the run authority ID
    --allowlist FILE                    an allowlist run: a file of peer ids
    --revocations FILE                  the authority's revocation list, loaded
                                        and published (certificate runs)

Without any of them a run is open: anyone who knows its id may join, and the
peer says so when it starts.  Everything the user gives is checked before the
node starts, against this peer's own id (so a closed run needs a stable
identity: ``--identity FILE``, by default :data:`DEFAULT_IDENTITY`, the file
``p2pdl identity`` prints the id of).  A missing file, a certificate for
another run or peer, an expired one, a wrong authority id or a bad allowlist
line is a :class:`~p2pdl.errors.ConfigError`: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, IdentityError
from ._args import peer_id_text

__all__ = ["DEFAULT_IDENTITY", "RunPlan", "add_membership", "certificate_problem",
           "check_readable", "closed", "identity_path", "load_certificate", "load_revocations",
           "peer_id_of_identity", "plan_runs", "reason", "revocations_problem",
           "signature_problem", "utc"]

#: The identity file of ``p2pdl identity``, and of closed runs without ``--identity``.
DEFAULT_IDENTITY = Path("~/.p2pdl/identity.key")


def add_membership(parser: argparse.ArgumentParser) -> None:
    """Add --authority, --certificate, --allowlist and --revocations to ``parser``."""
    group = parser.add_argument_group(
        "run membership", "who may take part in the run; without these flags the run is "
                          "open to anyone who knows its id")
    group.add_argument("--authority", metavar="ID", type=peer_id_text,
                       help="the run authority's id (`p2pdl auth init` prints it): the run "
                            "admits only peers with a certificate it signed; needs "
                            "--certificate")
    group.add_argument("--certificate", metavar="FILE",
                       help="this peer's membership certificate (`p2pdl auth issue`)")
    group.add_argument("--allowlist", metavar="FILE",
                       help="a file of peer ids, one a line (# comments): the run admits "
                            "only those")
    group.add_argument("--revocations", metavar="FILE",
                       help="the authority's revocation list (`p2pdl auth revoke`), loaded "
                            "and published to the run's members")


def closed(args: argparse.Namespace) -> bool:
    """Whether the flags ask for a closed run (certificate or allowlist)."""
    return bool(args.authority or args.certificate or args.allowlist or args.revocations)


def identity_path(args: argparse.Namespace) -> str | None:
    """The identity file the node uses: --identity, else for a closed run
    :data:`DEFAULT_IDENTITY`, else None (a new identity every run)."""
    if args.identity is not None:
        return args.identity
    return str(DEFAULT_IDENTITY.expanduser()) if closed(args) else None


def peer_id_of_identity(path: str | os.PathLike[str]) -> str:
    """The peer id (base58) of the identity file at ``path``, created if missing."""
    from libp2p.peer.id import ID

    from ..net import load_or_create_identity

    try:
        key_pair = load_or_create_identity(Path(path).expanduser())
    except IdentityError as exc:
        raise ConfigError(str(exc)) from None
    return ID.from_pubkey(key_pair.public_key).to_base58()


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The run policies for the node, and the line that says what each run is."""

    policies: tuple[Any, ...]
    mode: str                    # "open" | "allowlist" | "certificate"
    lines: tuple[str, ...]
    revocations: Any = None      # a RevocationList to publish, or None

    def published_line(self, stored: bool) -> str:
        """What to say once :attr:`revocations` was published (``stored``: a DHT node holds it)."""
        r = self.revocations
        where = "published to the run" if stored else \
            "obeyed here; no DHT node took it yet (members read it from peers that hold it)"
        return (f"revocation list of run {r.run_id!r}: sequence {r.sequence}, "
                f"{len(r.serials)} serial(s) revoked; {where}")


def plan_runs(args: argparse.Namespace, run_ids: Sequence[str], peer_id: str | None, *,
              member: bool = True, now: float | None = None) -> RunPlan:
    """Check the membership flags for ``run_ids`` and this peer, and build the policies.

    ``peer_id`` is this peer's id (needed for a closed run).  ``member``:
    this peer takes part in the run, so a certificate run needs its
    certificate (``p2pdl train``); a ``p2pdl node`` may guard certificate
    runs with ``--authority`` alone (it checks others' certificates and holds
    none).  Raises :class:`~p2pdl.errors.ConfigError` with one line that says
    what is wrong.
    """
    from ..service import check_run_id

    now = time.time() if now is None else now
    for run_id in run_ids:
        check_run_id(run_id)
    if args.allowlist and (args.authority or args.certificate):
        raise ConfigError("--allowlist and --authority/--certificate are two modes; "
                          "give one of them")
    if args.revocations and not args.authority:
        raise ConfigError("--revocations needs --authority ID (the list's signer)")
    if args.allowlist:
        return _allowlist_plan(args.allowlist, run_ids, peer_id)
    if args.authority or args.certificate:
        if not args.authority:
            raise ConfigError("--certificate needs --authority ID (the run authority's id, "
                              "which `p2pdl auth init` printed)")
        if not args.certificate and member:
            raise ConfigError("--authority needs --certificate FILE (this peer's "
                              "certificate, from `p2pdl auth issue`)")
        if not args.certificate:
            return _guard_plan(args, run_ids)
        return _certificate_plan(args, run_ids, peer_id, now)
    from ..membership import OpenRun

    if not run_ids:
        return RunPlan((), "open", ("this node guards no run (no --run-id): it admits "
                                    "anyone who knows a run's id to that run",))
    return RunPlan(tuple(OpenRun(r) for r in run_ids), "open",
                   tuple(f"run {r!r} is open: anyone who knows the run id can join it "
                         f"(see --authority/--certificate or --allowlist to close it)"
                         for r in run_ids))


def _allowlist_plan(path: str, run_ids: Sequence[str], peer_id: str | None) -> RunPlan:
    from ..membership import AllowlistRun

    check_readable(path, "allowlist")
    policies = []
    for run_id in run_ids:
        try:
            policy = AllowlistRun.load(run_id, path)
        except (ConfigError, ValueError) as exc:  # it names the file (and the line)
            raise ConfigError(reason(exc)) from None
        policies.append(policy)
    peers = _allowlist_peers(policies[0]) if policies else None
    count = f"{len(peers)} peer(s)" if peers is not None else "its peers"
    lines = [f"run {r!r} is an allowlist run: only {count} of {path} are admitted"
             for r in run_ids]
    if peer_id is not None and peers is not None and peer_id not in peers:
        raise ConfigError(f"this peer ({peer_id}) is not in the allowlist {path}: "
                          f"the run's members would refuse it")
    return RunPlan(tuple(policies), "allowlist", tuple(lines))


def _guard_plan(args: argparse.Namespace, run_ids: Sequence[str]) -> RunPlan:
    from ..membership import CertificateRun

    revocations = _revocations(args, run_ids[0]) if len(run_ids) == 1 else None
    if args.revocations and len(run_ids) != 1:
        raise ConfigError("--revocations is for one run; give one --run-id")
    policies = tuple(CertificateRun(r, args.authority, revocations=revocations)
                     for r in run_ids)
    lines = tuple(f"run {r!r} is a certificate run: only peers with a certificate from "
                  f"authority {args.authority} are admitted; this node holds none (it checks "
                  f"others' and takes no part)" for r in run_ids)
    return RunPlan(policies, "certificate", lines, revocations)


def _revocations(args: argparse.Namespace, run_id: str) -> Any:
    if not args.revocations:
        return None
    revocations = load_revocations(args.revocations)
    problem = revocations_problem(revocations, run_id=run_id, authority=args.authority)
    if problem is not None:
        raise ConfigError(f"revocation list {args.revocations}: {problem}")
    return revocations


def _certificate_plan(args: argparse.Namespace, run_ids: Sequence[str],
                      peer_id: str | None, now: float) -> RunPlan:
    from ..membership import CertificateRun

    certificate = load_certificate(args.certificate)
    if len(run_ids) != 1:
        raise ConfigError("--certificate is for one run; give one --run-id "
                          f"(got {len(run_ids)})")
    run_id = run_ids[0]
    problem = certificate_problem(certificate, run_id=run_id, peer_id=peer_id,
                                  authority=args.authority, now=now)
    if problem is not None:
        raise ConfigError(f"certificate {args.certificate}: {problem}")
    revocations = _revocations(args, run_id)
    if revocations is not None:
        if certificate.serial in set(revocations.serials):
            raise ConfigError(f"certificate {args.certificate}: serial {certificate.serial} "
                              f"is revoked by {args.revocations}")
    policy = CertificateRun(run_id, args.authority, certificate=certificate,
                            revocations=revocations)
    line = (f"run {run_id!r} is a certificate run: only peers with a certificate from "
            f"authority {args.authority} are admitted; this peer is a "
            f"{_role_name(certificate.role)} until {utc(certificate.expires_at)} "
            f"(serial {certificate.serial})")
    return RunPlan((policy,), "certificate", (line,), revocations)


# -- certificates and revocation lists, as the CLI reads them ----------------------

def check_readable(path: str, what: str) -> None:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} file {path} does not exist")
    if not p.is_file():
        raise ConfigError(f"{what} file {path} is not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"cannot read {what} file {path}")


def load_certificate(path: str) -> Any:
    """The certificate at ``path``; ConfigError (one line) if it cannot be read."""
    from ..membership import Certificate

    check_readable(path, "certificate")
    try:
        return Certificate.load(path)
    except ConfigError as exc:  # it names the file
        raise ConfigError(reason(exc)) from None
    except (ValueError, OSError) as exc:
        raise ConfigError(f"certificate {path}: {reason(exc)}") from None
    except Exception as exc:  # a corrupt file, whatever the decoder raised
        raise ConfigError(f"certificate {path} is not a certificate ({reason(exc)})") from None


def load_revocations(path: str) -> Any:
    """The revocation list at ``path``; ConfigError (one line) if it cannot be read."""
    from ..membership import RevocationList

    check_readable(path, "revocation list")
    try:
        return RevocationList.load(path)
    except ConfigError as exc:  # it names the file
        raise ConfigError(reason(exc)) from None
    except (ValueError, OSError) as exc:
        raise ConfigError(f"revocation list {path}: {reason(exc)}") from None
    except Exception as exc:
        raise ConfigError(f"revocation list {path} is not a revocation list "
                          f"({reason(exc)})") from None


def certificate_problem(certificate: Any, *, run_id: str | None, peer_id: str | None,
                        authority: str | None, now: float) -> str | None:
    """What is wrong with ``certificate`` for this use, in words; None if nothing."""
    if run_id is not None and certificate.run_id != run_id:
        return f"it is for run {certificate.run_id!r}, not {run_id!r}"
    if peer_id is not None and str(certificate.peer_id) != peer_id:
        return (f"it is for peer {certificate.peer_id}, not this peer ({peer_id}); "
                f"check --identity")
    if authority is not None and str(certificate.authority) != authority:
        return (f"it was signed by authority {certificate.authority}, not by --authority "
                f"{authority}")
    if certificate.issued_at > now:
        return f"it is valid only from {utc(certificate.issued_at)} (check this clock)"
    if certificate.expires_at <= now:
        return f"it expired at {utc(certificate.expires_at)}; ask the run's operator for a new one"
    problem = signature_problem(certificate, authority=authority)
    return None if problem is None else f"{problem} (it is not {authority}'s certificate)"


def revocations_problem(revocations: Any, *, run_id: str | None,
                        authority: str | None) -> str | None:
    """What is wrong with a revocation list for this run and authority; None if nothing."""
    if run_id is not None and revocations.run_id != run_id:
        return f"it is for run {revocations.run_id!r}, not {run_id!r}"
    if authority is not None and str(revocations.authority) != authority:
        return f"it was signed by authority {revocations.authority}, not by {authority}"
    return signature_problem(revocations, authority=authority)


def signature_problem(record: Any, *, authority: str | None = None) -> str | None:
    """Whether ``record`` (a certificate or a revocation list) is signed by
    ``authority`` (default: the authority it names); None if it is.  Its times
    are not judged here."""
    authority = str(record.authority) if authority is None else authority
    if hasattr(record, "peer_id"):  # a certificate: checked at its own issue time
        return record.problem(authority, record.run_id, record.peer_id, record.issued_at)
    return record.problem(authority, record.run_id, record.issued_at)


def utc(timestamp: float) -> str:
    """``2025-01-31 12:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def _role_name(role: Any) -> str:
    return getattr(role, "value", str(role))


def _allowlist_peers(policy: Any) -> set[str] | None:
    peers = getattr(policy, "peers", None)
    if peers is None:
        return None
    return {p if isinstance(p, str) else p.to_base58() for p in peers}


def reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
