"""Accusations that travel, in the all-reduce service (``_service``): the
proofs of equivocation this node found, published in certificate runs, and
the other members' proofs, read and checked (the sans-IO part is
``_accusations``).

:class:`_AccusationSide` is a part of :class:`AllReduceService`, which holds
the state its methods use.
"""

from __future__ import annotations

import logging

import trio
from libp2p.peer.id import ID

from ...dht import Schema, owner_of
from ...errors import LocalProtocolError
from ._accusations import ACCUSATIONS_PREFIX, Accusations, Equivocation
from ._session import EQUIVOCATION_FLAG, FALSE_ACCUSATION_FLAG

__all__ = ["_AccusationSide", "ACCUSATION_TTL", "ACCUSATIONS_SCHEMA"]

logger = logging.getLogger(__name__)

#: How long a published record lives in the DHT (s): as long as the ban it
#: brings (``FlagBook.ban_seconds``' default); republished while it changes.
ACCUSATION_TTL = 3600.0
#: The DHT schema of accusation records (one owned, signed subkey per member).
ACCUSATIONS_SCHEMA = Schema(ACCUSATIONS_PREFIX, Accusations, dictionary=True,
                            signed_subkeys=True)


class _AccusationSide:
    """Publishing and reading accusations for :class:`AllReduceService`."""

    def _shares_accusations(self, run_id: str) -> bool:
        """Accusations travel in certificate runs this node holds a certificate of."""
        return self._dht is not None and self._members.credential(run_id) is not None

    def _watch(self, run_id: str) -> None:
        """Read ``run_id``'s accusations from now on (the run of a group this
        node averages in, auxiliary or not)."""
        if self._shares_accusations(run_id):
            new = run_id not in self._board.watched()
            self._board.watch(run_id)   # the most recent runs stay watched
            if new:
                self._board_changed.set()

    def _accuse(self, run_id: str, proof: Equivocation) -> None:
        """Publish ``proof`` in ``run_id`` (certificate runs; elsewhere the
        ban stays this node's own)."""
        self._board.first_proof(proof)   # found here: the others' copies flag nothing more
        if self._shares_accusations(run_id) and self._board.accuse(run_id, proof):
            self._board_changed.set()

    async def _accusations_loop(self) -> None:
        """Publish what changed, then read every watched run, every
        ``accusation_interval`` seconds or when a proof was added."""
        while True:
            with trio.move_on_after(self._config.accusation_interval):
                await self._board_changed.wait()
            self._board_changed = trio.Event()
            for run_id in self._board.pending():
                await self._publish_accusations(run_id)
            for run_id in self._board.watched():
                await self.read_accusations(run_id)

    async def _publish_accusations(self, run_id: str) -> None:
        dht = self._dht
        assert dht is not None
        record = self._board.record(run_id)
        try:
            stored = await dht.store(ACCUSATIONS_PREFIX + run_id, record,
                                     dht.now() + ACCUSATION_TTL, subkey=dht.own_subkey())
        except LocalProtocolError as exc:   # no node would store it: logged, not retried
            logger.warning("run %s: accusations not published: %s", run_id, exc)
            self._board.published(run_id)
            return
        self._board.published(run_id)
        self._counters["accusations_published"] += len(record.equivocations)
        if not stored:
            logger.info("run %s: no member holds this node's accusations yet", run_id)

    async def read_accusations(self, run_id: str) -> int:
        """Read and check the members' published accusations of ``run_id``
        now; returns how many proofs were new.  A true proof flags (and
        bans) the reducer ``equivocation``; a false one flags its publisher
        ``false_accusation``."""
        dht = self._dht
        if dht is None:
            return 0
        found = await dht.get(ACCUSATIONS_PREFIX + run_id, latest=True)
        if found is None or not found.dictionary:
            return 0
        checked = 0
        now = self._clock()
        me = self._host.peer_id
        for subkey, entry in sorted(found.value.items()):
            owner = owner_of(subkey)
            record = entry.value
            if owner is None or owner == me or not isinstance(record, Accusations):
                continue
            upheld, false = self._board.judge(owner.to_bytes(), record)
            for proof in upheld:
                accused = ID(proof.reducer)
                if accused != me and self._board.first_proof(proof):   # one flag per lie
                    self._flags.flag(accused, run_id, EQUIVOCATION_FLAG, now,
                                     f"proven by the two signed results {owner} published "
                                     f"(group {proof.group_id.hex()[:8]}, part {proof.part})")
            for _, problem in false:
                self._flags.flag(owner, run_id, FALSE_ACCUSATION_FLAG, now,
                                 f"it published an accusation that is false: {problem}")
            self._counters["accusations_upheld"] += len(upheld)
            self._counters["accusations_false"] += len(false)
            checked += len(upheld) + len(false)
        return checked
