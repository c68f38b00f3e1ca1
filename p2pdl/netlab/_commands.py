"""Running ``ip``, ``nft``, ``tc`` and ``sh``: every call has a timeout.

The lab is built by plain subprocess calls, never by netlink from Python, so
that a failing step can be reproduced by pasting the logged command into a
root shell.  A failure becomes :class:`NetlabError` with the command and its
stderr; a missing program becomes :class:`NetlabUnavailable`.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence

from ._errors import NetlabError, NetlabUnavailable

logger = logging.getLogger("p2pdl.netlab")

#: Seconds one lab command may take.  Each one is a few milliseconds; deleting
#: many namespaces at once is the slowest (the kernel tears them down lazily).
COMMAND_TIMEOUT = 30.0

#: Where each program comes from, for the error that says it is missing.
PACKAGES = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables"}


def run_command(argv: Sequence[str], *, input: str | None = None,
                timeout: float = COMMAND_TIMEOUT,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion and return its result (text mode).

    Raises :class:`NetlabError` if it exits non-zero (with ``check``) or runs
    past ``timeout`` seconds (the child is killed), and
    :class:`NetlabUnavailable` if the program does not exist.
    """
    logger.debug("netlab: %s", shlex.join(argv))
    try:
        result = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                                timeout=timeout, check=False)
    except FileNotFoundError:
        package = PACKAGES.get(argv[0])
        hint = f" (Debian package {package})" if package else ""
        raise NetlabUnavailable(f"{argv[0]!r} is not installed{hint}") from None
    except subprocess.TimeoutExpired:
        raise NetlabError(f"{shlex.join(argv)} did not finish within {timeout:g} s") from None
    if check and result.returncode != 0:
        stderr = result.stderr.strip() or result.stdout.strip() or "(no output)"
        raise NetlabError(f"{shlex.join(argv)} failed (exit {result.returncode}): {stderr}")
    return result


def ip(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip [-n NETNS] ARGS``: an iproute2 command, inside ``netns`` if given."""
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return run_command([*prefix, *args], check=check)


def ip_batch(netns: str | None, lines: Iterable[str], *, force: bool = False,
             timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Several ``ip`` commands in one process (``ip -batch -``): one fork, not many.

    With ``force`` the batch goes on after a failing line (used for removal,
    where "already gone" is fine) and the result is not checked.
    """
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    flags = ["-force"] if force else []
    return run_command([*prefix, *flags, "-batch", "-"], input="\n".join(lines) + "\n",
                       timeout=timeout, check=not force)


def tc(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``tc -n NETNS ARGS``: a traffic-control command inside ``netns``."""
    return run_command(["tc", "-n", netns, *args])


def exec_prefix(netns: str) -> list[str]:
    """The argv prefix that runs a program inside ``netns``.

    ``ip netns exec`` enters the namespace, remounts ``/sys`` for it and then
    execs the program, so the child's pid is the program's own pid (signals
    reach it directly).
    """
    return ["ip", "netns", "exec", netns]


def nft(netns: str, ruleset: str) -> subprocess.CompletedProcess[str]:
    """Load an nftables ``ruleset`` (``nft -f -`` syntax) inside ``netns``."""
    # `ip netns exec` reports a missing program as its own exit 255; say it plainly.
    if shutil.which("nft") is None:
        raise NetlabUnavailable(f"'nft' is not installed (Debian package {PACKAGES['nft']})")
    return run_command([*exec_prefix(netns), "nft", "-f", "-"], input=ruleset)


def write_sysctl(netns: str, key: str, value: str) -> None:
    """Set a per-namespace sysctl such as ``net.ipv4.ip_forward``.

    Written through ``/proc/sys`` with ``sh`` because ``sysctl`` (procps) is
    not always installed; ``/proc/sys/net`` shows the namespace of the writer.
    """
    path = "/proc/sys/" + key.replace(".", "/")
    run_command([*exec_prefix(netns), "sh", "-c", f"echo {shlex.quote(value)} > {path}"])
