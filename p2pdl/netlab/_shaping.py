"""Bandwidth caps: a token bucket (tbf) per direction of one interface.

Upload (egress) is capped by a ``tbf`` root qdisc on the interface itself.
Download (ingress) cannot be queued where it arrives, so it is redirected to
an IFB device in the same namespace (``ingress`` qdisc, a match-all ``u32``
filter with ``mirred egress redirect``) and capped by a ``tbf`` there.  This
kernel has neither ``matchall`` nor ``flower`` classifiers; ``u32 match u32 0
0`` matches every packet.

**Only bandwidth.**  ``netem`` does not exist in this kernel ("Specified
qdisc kind is unknown"), so there is no emulated delay, jitter, loss or
reordering; the only latency is the queueing delay of a full queue (at most
max(50 ms, 64 KiB at the rate)).  Neither do ``fq``/``fq_codel``/``sfq``.

Accuracy (measured here with ``simulations/bench_netlab.py``: one bulk TCP
transfer lasting a second, Python sockets, median of three): caps of 5, 20,
100 and 1000 Mbit/s give 96.1 % of the cap as TCP payload, both on egress
and through the IFB; 1 Mbit/s gives 97.6 %.  The cap counts whole Ethernet
frames, so TCP payload can reach at most about 1448/1514 = 95.6 % of it;
the rest is the first bucketful, which arrives at once.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import ConfigError
from ._commands import ip, tc

__all__ = ["Rate", "tbf_args", "shape"]

#: The smallest bucket: two full Ethernet frames.  Larger minimums let short
#: transfers on slow links beat the cap (a 64 KiB bucket let a 1 Mbit/s link
#: carry 1.9 Mbit/s over one second); tbf splits GSO super-packets larger
#: than the bucket into frames, which costs nothing measurable here.
MIN_BURST_BYTES = 2 * 1514

#: The bucket holds this much time at the full rate (625 kB at 1 Gbit/s).
#: 2 ms lost 0.3 % of throughput at 20 Mbit/s and above; 5 ms lost nothing.
BURST_TIME = 0.005

#: The queue holds this much time at the full rate, before tbf drops...
QUEUE_TIME = 0.050

#: ...but at least this many bytes: TCP on the sending host keeps up to about
#: 64 KiB in the queue, and shorter queues on slow links dropped enough to
#: cost a fifth of the throughput at 1 Mbit/s.  The most queueing delay a
#: capped link adds is therefore max(50 ms, 64 KiB at the rate).
MIN_QUEUE_BYTES = 64 * 1024

#: The slowest cap accepted: below this tbf's bucket arithmetic gets coarse
#: and a test transfer would take minutes.
MIN_RATE_MBIT = 0.1


@dataclasses.dataclass(frozen=True)
class Rate:
    """A link's caps in Mbit/s (10**6 bit/s); ``None`` means uncapped.

    ``up`` is what leaves the namespace through the interface (upload),
    ``down`` what arrives (download).
    """

    up: float | None = None
    down: float | None = None

    @classmethod
    def build(cls, rate_mbit: float | None, up_mbit: float | None = None,
              down_mbit: float | None = None) -> Rate:
        """``up_mbit``/``down_mbit`` if given, else ``rate_mbit``; validated.

        Raises :class:`~p2pdl.errors.ConfigError` for a cap that is not a
        finite number of at least :data:`MIN_RATE_MBIT`.
        """
        up = up_mbit if up_mbit is not None else rate_mbit
        down = down_mbit if down_mbit is not None else rate_mbit
        for value in (up, down):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value < MIN_RATE_MBIT):
                raise ConfigError(f"invalid rate {value!r} Mbit/s: a number >= {MIN_RATE_MBIT} "
                                  f"expected, or None for uncapped")
        return cls(None if up is None else float(up), None if down is None else float(down))

    def __str__(self) -> str:
        def one(value: float | None) -> str:
            return "uncapped" if value is None else f"{value:g} Mbit/s"
        if self.up == self.down:
            return one(self.up)
        return f"up {one(self.up)}, down {one(self.down)}"


def tbf_args(rate_mbit: float) -> list[str]:
    """The ``tc qdisc ... tbf`` parameters for a cap of ``rate_mbit`` Mbit/s."""
    bits_per_s = int(rate_mbit * 1_000_000)
    burst = max(MIN_BURST_BYTES, int(bits_per_s / 8 * BURST_TIME))
    limit = burst + max(MIN_QUEUE_BYTES, int(bits_per_s / 8 * QUEUE_TIME))
    return ["rate", f"{bits_per_s}bit", "burst", str(burst), "limit", str(limit)]


def shape(netns: str, dev: str, rate: Rate, *, ifb: str = "ifb0") -> None:
    """Cap ``dev`` in ``netns``: egress at ``rate.up``, ingress at ``rate.down`` via ``ifb``.

    Call once per interface, on an interface with no qdiscs of its own yet.
    The IFB device is created in ``netns`` and goes away with it.
    """
    if rate.up is not None:
        tc(netns, "qdisc", "add", "dev", dev, "root", "tbf", *tbf_args(rate.up))
    if rate.down is not None:
        ip(netns, "link", "add", ifb, "type", "ifb")
        ip(netns, "link", "set", ifb, "up")
        tc(netns, "qdisc", "add", "dev", ifb, "root", "tbf", *tbf_args(rate.down))
        tc(netns, "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress")
        tc(netns, "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all",
           "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb)
