"""The reachability service: asks peers to dial back, answers their requests."""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import logging

import trio
from libp2p.peer.id import ID

from ..errors import P2PDLError, ProtocolNotSupportedError, RequestError
from ..net import parse_multiaddr
from ..service import Reachability, RpcEndpoint, ServiceContext, Statistics
from ..wire import Message, RequestContext
from ._messages import DIALBACK, DialBackRequest, DialBackResponse, DialBackResult
from ._state import ReachabilityTracker
from .config import NatConfig

__all__ = ["NatService", "NatStatistics"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NatStatistics(Statistics):
    """What ``NatService.statistics()`` says: the verdict and the dial-back traffic."""

    reachability: str
    client_mode: bool
    probes_sent: int = 0
    probes_failed: int = 0
    requests_answered: int = 0
    requests_refused: int = 0


#: The counters of :class:`NatStatistics`.
COUNTERS = NatStatistics.counter_names()

#: A peer that does not speak the dial-back protocol is not asked again for this long (s).
NON_PROBER_RETRY = 600.0


class NatService:
    """Reachability and client mode for one node.

    As a client it asks connected peers, in turn, to dial its direct
    addresses back on fresh connections, and tells the host to hold relay
    reservations until it is known to be public.  As a server it dials
    others back, only at addresses with the IP their connection comes from
    (so it cannot be used to make connections to third parties), at most
    ``server_concurrency`` at once and once per ``server_min_interval`` per peer.
    """

    def __init__(self, context: ServiceContext, config: NatConfig | None = None
                 ) -> None:
        self._host = context.host
        self._call = context.call
        self._config = config = config or NatConfig()
        self._counters: collections.Counter[str] = collections.Counter()
        self._tracker = ReachabilityTracker(config)
        self._status = Reachability.UNKNOWN
        self._changed = trio.Event()
        self._non_probers: dict[ID, float] = {}
        self._server_slots = trio.Semaphore(config.server_concurrency)
        self._last_request: dict[ID, float] = {}

    # -- what the layers above read ------------------------------------------------

    @property
    def reachability(self) -> Reachability:
        return self._status

    @property
    def client_mode(self) -> bool:
        """A client dials out and accepts nothing (DeDLOC's client-mode peer)."""
        if self._config.client_mode is not None:
            return self._config.client_mode
        return self._status is Reachability.PRIVATE

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def endpoints(self) -> list[RpcEndpoint]:
        """The dial-back protocol (served to everyone: it is not run-scoped)."""
        return [RpcEndpoint(DIALBACK, self.handle)]

    def statistics(self) -> NatStatistics:
        return NatStatistics(self._status.value, self.client_mode,
                             **{name: self._counters[name] for name in COUNTERS})

    # -- client side ------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Probe, update, wait; for the node's lifetime."""
        task_status.started()
        if not self._config.enabled:
            await trio.sleep_forever()
        while True:
            await self._probe_once()
            if self._status is Reachability.UNKNOWN and self._tracker.has_unasked(
                    [str(p) for p in self._probers()]):
                continue  # more peers can settle it now; ask the next one at once
            wait = self._tracker.interval(self._status)
            deadline = trio.current_time() + wait
            seen_peers = len(self._host.connected_peers())
            version = self._host.addrs_version
            # Wake early when addresses change, or when a first/new peer can probe us
            # while we still do not know.
            while trio.current_time() < deadline:
                await self._host.wait_connections_changed(deadline - trio.current_time())
                if self._host.addrs_version != version:
                    break
                if self._status is Reachability.UNKNOWN and \
                        len(self._host.connected_peers()) > seen_peers:
                    break

    async def _probe_once(self) -> None:
        now = trio.current_time()
        if self._tracker.set_addresses(self._host.direct_addrs()):
            logger.debug("checking reachability of %s", ", ".join(self._tracker.addresses))
        probers = {str(p): p for p in self._probers()}
        chosen = self._tracker.choose_prober(list(probers), now)
        if chosen is not None and self._tracker.addresses:
            await self._ask(probers[chosen])
        self._update(self._tracker.status(trio.current_time(), len(self._probers())))

    def _probers(self) -> list[ID]:
        """Connected peers that may answer dial-back requests."""
        now = trio.current_time()
        return [p for p in self._host.connected_peers()
                if self._non_probers.get(p, float("-inf")) <= now]

    async def _ask(self, prober: ID) -> None:
        addrs = list(self._tracker.addresses)[: self._config.max_addrs]
        timeout = self._config.probe_timeout * 2 + 5
        self._counters["probes_sent"] += 1
        try:
            response = await self._call(prober, DIALBACK, DialBackRequest(addrs), timeout)
        except ProtocolNotSupportedError:
            self._non_probers[prober] = trio.current_time() + NON_PROBER_RETRY
            return
        except P2PDLError as exc:  # busy, rate-limited, gone: ask someone else later
            logger.debug("dial-back request to %s failed: %s", prober, exc)
            self._counters["probes_failed"] += 1
            self._tracker.record(str(prober), "", False, trio.current_time())
            return
        assert isinstance(response, DialBackResponse)
        now = trio.current_time()
        for result in response.results:
            # "refused" means the address is not where our connection comes
            # from: seen from outside, it is not ours to be reached at.
            self._tracker.record(str(prober), result.addr, result.status == "ok", now)

    def _update(self, status: Reachability) -> None:
        if status is not self._status:
            logger.info("reachability: %s -> %s", self._status.value, status.value)
            self._status = status
            self._host.set_wants_relays(status is not Reachability.PUBLIC)
            self._changed.set()
            self._changed = trio.Event()

    # -- server side ------------------------------------------------------------------

    async def handle(self, ctx: RequestContext, request: Message) -> DialBackResponse:
        assert isinstance(request, DialBackRequest)
        now = trio.current_time()
        last = self._last_request.get(ctx.peer_id)
        if last is not None and now - last < self._config.server_min_interval:
            self._counters["requests_refused"] += 1
            raise RequestError("unavailable", "too many dial-back requests; try later")
        self._last_request[ctx.peer_id] = now
        for peer, at in list(self._last_request.items()):  # bounded by recent requesters
            if now - at > self._config.server_min_interval:
                del self._last_request[peer]
        try:
            self._server_slots.acquire_nowait()
        except trio.WouldBlock:
            self._counters["requests_refused"] += 1
            raise RequestError("unavailable", "busy dialling other peers back") from None
        try:
            self._counters["requests_answered"] += 1
            return DialBackResponse(await self._dial_back(ctx.peer_id, request.addrs))
        finally:
            self._server_slots.release()

    async def _dial_back(self, peer: ID, addrs: list[str]) -> list[DialBackResult]:
        observed = self._host.observed_ip(peer)
        results: dict[int, DialBackResult] = {}

        async def one(i: int, addr: str) -> None:
            reason = _refusal(addr, observed)
            if reason:
                results[i] = DialBackResult(addr, "refused", reason)
                return
            try:
                await self._host.probe(addr, peer, self._config.probe_timeout)
                results[i] = DialBackResult(addr, "ok")
            except P2PDLError as exc:
                results[i] = DialBackResult(addr, "failed", str(exc)[:500])

        async with trio.open_nursery() as nursery:
            for i, addr in enumerate(addrs):
                if i < self._config.max_addrs:
                    nursery.start_soon(one, i, addr)
                else:
                    results[i] = DialBackResult(addr, "refused", "too many addresses")
        return [results[i] for i in range(len(addrs))]


def _refusal(addr: str, observed: str | None) -> str:
    """Why ``addr`` must not be dialled for a peer seen at ``observed`` ('' if fine)."""
    if observed is None:
        return "no direct connection to compare the address with"
    try:
        maddr = parse_multiaddr(addr)
        names = [p.name for p in maddr.protocols()]
        if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]) or \
                any(n not in ("ip4", "ip6", "tcp", "p2p") for n in names):
            return "not a direct TCP address"
        ip = maddr.value_for_protocol(names[0])
        if ipaddress.ip_address(ip) != ipaddress.ip_address(observed):
            return f"address IP {ip} is not the IP your connection comes from ({observed})"
    except (P2PDLError, ValueError) as exc:
        return f"unusable address: {exc}"
    return ""
