"""``p2pdl auth``: a run authority's key, the certificates it signs, its revocation list.

    p2pdl auth init --out DIR
    p2pdl auth issue --authority KEY --run-id R --peer-id ID --role ROLE --expires 7d
                     --out FILE [--serial N]
    p2pdl auth revoke --authority KEY --run-id R --serial N [--serial M ...] --list FILE
    p2pdl auth show FILE [--authority ID]

``init`` makes the authority key (mode 0600, never overwriting one) and its
public id file; the id is what every member passes as ``--authority``.
``issue`` signs one peer's certificate for one run; ``revoke`` adds serials
to the run's revocation list (a new list at sequence 1, or the existing one's
serials at its sequence + 1).  ``show`` prints a certificate's or a list's
fields and whether its signature verifies (exit status 0; 1 if it does not).
Every mistake of the user is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, P2PDLError
from ._args import duration, peer_id_text, positive_int, run_id_text
from ._runs import (
    load_revocations,
    reason,
    signature_problem,
    utc,
)

__all__ = ["ROLES", "add_parser", "run_init", "run_issue", "run_revoke", "run_show"]

#: The roles a certificate can bind (``p2pdl.service.Role`` values).
ROLES = ("trainer", "auxiliary", "monitor")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl auth`` and its subcommands to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "auth", help="run authority: make its key, issue and revoke membership certificates",
        description="Close a run to invited peers: make a run authority key (init), sign a "
                    "certificate for each member's peer id (issue; the peer id comes from "
                    "`p2pdl identity`), revoke certificates (revoke), inspect a file (show).")
    cmds = p.add_subparsers(dest="auth_command", metavar="SUBCOMMAND", required=True)

    init = cmds.add_parser("init", help="make a run authority key and print its id",
                           description="Make a run authority key in DIR (mode 0600; an "
                                       "existing key is never overwritten) and print its "
                                       "public id, the --authority of the run's members.")
    init.add_argument("--out", required=True, metavar="DIR",
                      help="directory for the key and its public id file")
    init.set_defaults(handler=run_init)

    issue = cmds.add_parser("issue", help="sign a member's certificate",
                            description="Sign a certificate that admits one peer to one run "
                                        "in one role until it expires.")
    _add_authority_key(issue)
    issue.add_argument("--run-id", required=True, type=run_id_text, help="the run")
    issue.add_argument("--peer-id", required=True, type=peer_id_text, metavar="ID",
                       help="the member's peer id (it runs `p2pdl identity`)")
    issue.add_argument("--role", required=True, choices=ROLES,
                       help="trainer (computes, averages, serves state), auxiliary (only "
                            "averages and serves state) or monitor (only follows progress "
                            "and downloads state)")
    issue.add_argument("--expires", required=True, type=duration, metavar="DURATION",
                       help="valid for this long from now: 30m, 12h, 7d, 2w")
    issue.add_argument("--serial", type=positive_int, default=None, metavar="N",
                       help="the certificate's serial, to revoke it by (default: chosen at "
                            "random)")
    issue.add_argument("--out", required=True, metavar="FILE",
                       help="where to write the certificate (give it to the member)")
    issue.set_defaults(handler=run_issue)

    revoke = cmds.add_parser("revoke", help="add serials to the run's revocation list",
                             description="Revoke certificates by serial: adds them to the "
                                         "revocation list FILE (created if missing), signed "
                                         "at the next sequence number.  Members load it with "
                                         "--revocations FILE and publish it to the run.")
    _add_authority_key(revoke)
    revoke.add_argument("--run-id", required=True, type=run_id_text, help="the run")
    revoke.add_argument("--serial", required=True, type=positive_int, action="append",
                        metavar="N", help="a serial to revoke (repeat for more)")
    revoke.add_argument("--list", required=True, metavar="FILE",
                        help="the revocation list file to update or create")
    revoke.set_defaults(handler=run_revoke)

    show = cmds.add_parser("show", help="print a certificate or a revocation list",
                           description="Print the fields of a certificate or a revocation "
                                       "list and whether its signature verifies (exit status "
                                       "1 if it does not).")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--authority", type=peer_id_text, metavar="ID", default=None,
                      help="verify under this authority id (default: the one it names)")
    show.add_argument("--json", action="store_true", help="print the fields as JSON")
    show.set_defaults(handler=run_show)


def _add_authority_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--authority", required=True, metavar="KEY",
                        help="the authority's private key file (from `p2pdl auth init`)")


def _load_authority(path: str) -> Any:
    from ..membership import Authority

    if not Path(path).exists():
        raise ConfigError(f"authority key file {path} does not exist "
                          f"(`p2pdl auth init --out DIR` makes one)")
    try:
        return Authority.load(path)
    except P2PDLError as exc:  # it names the file and the reason
        raise ConfigError(reason(exc)) from None


def _save(path: str, record: Any) -> None:
    """Save a certificate or a revocation list to ``path`` atomically (a temp
    file, then a rename: a reader never sees half a file)."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{path} is a directory; give a file name")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        record.save(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None


# -- init ----------------------------------------------------------------------------

def run_init(args: argparse.Namespace) -> int:
    from ..membership import Authority

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory")
    authority = Authority.generate()
    try:
        key = authority.save(out)
    except ConfigError:  # the key file exists
        raise ConfigError(f"{out / 'authority.key'} already exists: an authority key is "
                          f"never overwritten (use another --out)") from None
    except OSError as exc:
        raise ConfigError(f"cannot write the authority key in {out}: {exc.strerror}") from None
    print(f"authority id: {authority.id}")
    print(f"private key:  {key}  (mode 0600: keep it secret; it signs certificates)")
    public = Path(key).parent / "authority.id"
    if public.exists():
        print(f"public id:    {public}")
    print(f"members run with: --authority {authority.id} --certificate FILE")
    return 0


# -- issue ---------------------------------------------------------------------------

def run_issue(args: argparse.Namespace) -> int:
    from ..service import Role

    authority = _load_authority(args.authority)
    now = time.time()
    try:
        certificate = authority.issue(args.run_id, args.peer_id, Role(args.role),
                                      expires_in=args.expires, serial=args.serial, now=now)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"cannot issue the certificate: {reason(exc)}") from None
    _save(args.out, certificate)
    print(f"certificate: {args.out}")
    for name, value in _certificate_fields(certificate):
        print(f"  {name + ':':<11} {value}")
    return 0


def _certificate_fields(certificate: Any) -> list[tuple[str, str]]:
    return [("run", certificate.run_id), ("peer", str(certificate.peer_id)),
            ("role", getattr(certificate.role, "value", str(certificate.role))),
            ("issued", utc(certificate.issued_at)),
            ("expires", utc(certificate.expires_at)),
            ("serial", str(certificate.serial)),
            ("authority", str(certificate.authority))]


# -- revoke --------------------------------------------------------------------------

def run_revoke(args: argparse.Namespace) -> int:
    authority = _load_authority(args.authority)
    serials = set(args.serial)
    sequence = 1
    if Path(args.list).exists():
        old = load_revocations(args.list)
        if old.run_id != args.run_id:
            raise ConfigError(f"revocation list {args.list} is for run {old.run_id!r}, "
                              f"not {args.run_id!r}")
        if str(old.authority) != authority.id:
            raise ConfigError(f"revocation list {args.list} was signed by authority "
                              f"{old.authority}, not by this key ({authority.id})")
        problem = signature_problem(old, authority=authority.id)
        if problem is not None:
            raise ConfigError(f"revocation list {args.list}: {problem}")
        serials |= set(old.serials)
        sequence = old.sequence + 1
    try:
        revocations = authority.revocation_list(args.run_id, sorted(serials),
                                                sequence=sequence)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"cannot sign the revocation list: {reason(exc)}") from None
    _save(args.list, revocations)
    print(f"revocation list: {args.list}")
    print(f"  run:      {revocations.run_id}")
    print(f"  sequence: {revocations.sequence}")
    print(f"  serials:  {', '.join(str(s) for s in sorted(revocations.serials))}")
    return 0


# -- show ----------------------------------------------------------------------------

def run_show(args: argparse.Namespace) -> int:
    from ..membership import Certificate, RevocationList

    if not Path(args.file).is_file():
        raise ConfigError(f"{args.file} does not exist" if not Path(args.file).exists()
                          else f"{args.file} is not a file")
    record: Any = None
    problems = []
    for kind in (Certificate, RevocationList):
        try:
            record = kind.load(args.file)
            break
        except P2PDLError as exc:  # not this kind (its header), or a damaged one
            problems.append(reason(exc))
    if record is None:
        damaged = [p for p in problems if "first line" not in p and "not ASCII" not in p]
        raise ConfigError(damaged[0] if damaged else
                          f"{args.file} is neither a certificate nor a revocation list")
    is_certificate = isinstance(record, Certificate)
    if is_certificate:
        fields = _certificate_fields(record)
        now = time.time()
        if record.expires_at <= now:
            fields.append(("status", "expired"))
        else:
            fields.append(("status", f"valid for {_human_seconds(record.expires_at - now)}"))
    else:
        fields = [("run", record.run_id), ("sequence", str(record.sequence)),
                  ("serials", ", ".join(str(s) for s in sorted(record.serials)) or "none"),
                  ("authority", str(record.authority))]
        issued = getattr(record, "issued_at", None)
        if issued is not None:
            fields.insert(2, ("issued", utc(issued)))
    authority = args.authority or str(record.authority)
    problem = None
    if args.authority is not None and str(record.authority) != args.authority:
        problem = f"it names authority {record.authority}, not {args.authority}"
    if problem is None:
        problem = signature_problem(record, authority=authority)
    verdict = f"verifies under authority {authority}" if problem is None \
        else f"does NOT verify: {problem}"
    kind_name = "certificate" if is_certificate else "revocation list"
    if args.json:
        print(json.dumps({"kind": kind_name, **dict(fields), "verifies": problem is None,
                          "problem": problem}))
    else:
        print(f"{kind_name}: {args.file}")
        for name, value in fields:
            print(f"  {name + ':':<11} {value}")
        print(f"  {'signature:':<11} {verdict}")
    return 0 if problem is None else 1


def _human_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
