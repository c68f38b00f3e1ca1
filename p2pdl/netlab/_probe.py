"""Can the lab run here?  A quick yes/no for tests, a detailed report for people.

:func:`check` tries each facility the lab uses, once, in a scratch namespace
of its own (named like a run, so :func:`~p2pdl.netlab.cleanup` would find it
if the probe were killed half-way).  :func:`available` caches the verdict
for the process, for ``pytest.skip(reason)``.
"""

from __future__ import annotations

import dataclasses
import functools

from ._cleanup import remove_run
from ._commands import exec_prefix, ip, ip_batch, nft, run_command, write_sysctl
from ._errors import NetlabError, NetlabUnavailable
from ._names import claim_run_id, list_netns, netns_name, parse_netns
from ._nat import NatType, nat_ruleset
from ._shaping import Rate, shape
from ._topology import preflight

__all__ = ["Facility", "check", "available", "require"]


@dataclasses.dataclass(frozen=True)
class Facility:
    """One thing the lab needs (or would like), and whether this machine has it."""

    name: str
    ok: bool
    detail: str = ""
    required: bool = True


def check() -> list[Facility]:
    """Try everything the lab uses; one :class:`Facility` per item, in order.

    Stops at the first missing required facility that later ones depend on.
    ``netem`` is reported but not required: this kernel does not have it, and
    the lab models bandwidth and NAT only.  Takes about a tenth of a second.
    """
    try:
        preflight()
    except NetlabUnavailable as exc:
        return [Facility("root and ip/tc/nft", False, str(exc).split(": ", 1)[-1])]
    report = [Facility("root and ip/tc/nft", True)]
    taken = {parsed[0] for n in list_netns() if (parsed := parse_netns(n)) is not None}
    run_id = claim_run_id(taken)
    netns = netns_name(run_id, "probe")
    try:
        steps = [
            ("network namespaces", lambda: ip(None, "netns", "add", netns)),
            ("veth pairs and bridges", lambda: ip_batch(netns, [
                "link set lo up", "link add wan0 type veth peer name port1",
                "link add br0 type bridge", "link set port1 master br0",
                "link set wan0 up", "link set port1 up", "link set br0 up"])),
            ("ip netns exec", lambda: write_sysctl(netns, "net.ipv4.ip_forward", "1")),
            *[(f"nftables NAT ({nat.value})", functools.partial(_load_nat, netns, nat))
              for nat in NatType],
            ("tbf and ifb (bandwidth caps)", lambda: shape(netns, "wan0", Rate(100.0, 100.0))),
        ]
        for name, step in steps:
            try:
                step()
            except NetlabError as exc:
                report.append(Facility(name, False, str(exc)))
                return report
            report.append(Facility(name, True))
        netem = run_command(["tc", "-n", netns, "qdisc", "add", "dev", "port1", "root", "netem",
                             "delay", "10ms"], check=False)
        report.append(Facility(
            "netem (delay, loss)", netem.returncode == 0,
            "" if netem.returncode == 0 else
            "not in this kernel: the lab models bandwidth and NAT only", required=False))
    finally:
        remove_run(run_id, term_timeout=1.0)
    return report


def _load_nat(netns: str, nat: NatType) -> None:
    run_command([*exec_prefix(netns), "nft", "flush", "ruleset"])
    nft(netns, nat_ruleset(nat, wan="wan0"))


def _verdict(report: list[Facility]) -> tuple[bool, str]:
    missing = [f for f in report if f.required and not f.ok]
    if not missing:
        return True, "netlab can run here"
    return False, "netlab cannot run here: " + "; ".join(
        f"{f.name}: {f.detail}" if f.detail else f.name for f in missing)


@functools.cache
def _cached_verdict() -> tuple[bool, str]:
    try:
        return _verdict(check())
    except NetlabError as exc:
        return False, f"netlab cannot run here: {exc}"


def available(*, refresh: bool = False) -> tuple[bool, str]:
    """``(True, ...)`` if the lab can run here, else ``(False, reason)``.

    The first call runs :func:`check` (about 0.1 s); later calls return the
    cached verdict unless ``refresh``.  Never raises for a missing facility.
    """
    if refresh:
        _cached_verdict.cache_clear()
    return _cached_verdict()


def require() -> None:
    """Raise :class:`NetlabUnavailable` with the reason if the lab cannot run here."""
    ok, reason = available()
    if not ok:
        raise NetlabUnavailable(reason)
