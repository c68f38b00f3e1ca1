"""The monitor's views' document: the run over time, bounded (no network)."""

from __future__ import annotations

import json

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.monitor import Glance, History, Standing, run_state
from p2pdl.monitor._history import MAX_EPOCHS
from p2pdl.progress import GlobalProgress, PeerReport

RUN = "run-h"


def peer_id() -> bytes:
    return ID.from_pubkey(create_new_key_pair().public_key).to_bytes()


PEERS = [peer_id() for _ in range(4)]


def glance(now: float, epoch: int, quorum: int, *, losses=(2.0, 3.0), rate=100.0) -> Glance:
    view = GlobalProgress(epoch=epoch, samples_accumulated=300, estimated_samples=300.0,
                          target_batch_size=1000, num_peers=4, num_clients=1, num_auxiliary=1,
                          samples_per_second=rate, eta_next_epoch=now + 7, ready_to_step=False,
                          time=now, quorum_epoch=quorum)
    last = max(0, epoch - 1)
    peers = (PeerReport(PEERS[0], epoch, 200, 60.0, now - 1, name="alice", loss=losses[0],
                        path="direct", round_epoch=last, round_outcome="averaged",
                        round_group=3),
             PeerReport(PEERS[1], epoch, 100, 40.0, now - 2, client_mode=True, loss=losses[1],
                        path="relayed", round_epoch=last, round_outcome="partial",
                        round_group=2),
             PeerReport(PEERS[2], epoch, 0, 0.0, now - 1, auxiliary=True, path="hole-punched"),
             PeerReport(PEERS[3], epoch, 0, 0.0, now - 3))
    return Glance(view, peers, 0, None)


def test_points_and_epochs_follow_the_run():
    history = History(spacing=2.0)
    history.observe(glance(100.0, 3, 3), 100.0)
    history.observe(glance(101.0, 3, 3), 101.0)         # within the spacing: no point
    history.observe(glance(103.0, 4, 4), 103.0)         # epoch 3 completed
    history.observe(glance(110.0, 6, 6), 110.0)         # 4 and 5 completed at once
    assert [p.epoch for p in history.points] == [3, 4, 6]
    first = history.points[0]
    assert (first.trainers, first.auxiliary, first.clients, first.loss) == (3, 1, 1, 2.5)
    assert first.paths == (1, 1, 1, 1)                  # direct, punched, relayed, unsaid
    assert [(e.epoch, e.seconds) for e in history.epochs] == [(3, None), (4, 7.0), (5, 0.0)]
    # the trainers' rounds, as they said them: at epoch 5, one averaged, one partial
    assert history.round_summary(5) == {"outcomes": {"averaged": 1, "partial": 1},
                                        "group": 2.5}
    assert history.round_summary(4) == {"outcomes": {}, "group": None}   # nobody said


def test_points_are_thinned_and_epochs_bounded_so_a_long_run_stays_small():
    history = History(max_points=10, spacing=1.0)
    for t in range(1000):
        history.observe(glance(float(t), t, t), float(t))
    assert len(history.points) < 10 and history.spacing > 1.0
    assert history.points[0].time == 0.0                                # the whole run
    assert history.points[-1].time >= 999 - history.spacing
    assert len(history.epochs) == MAX_EPOCHS and history.epochs[-1].epoch == 998
    assert len(history.rounds) <= MAX_EPOCHS


def test_the_state_is_json_with_the_peers_trainers_first():
    history = History()
    history.observe(glance(50.0, 2, 2), 50.0)
    board = [Standing(ID(PEERS[0]).to_base58(), 900, 3, 0, 2, "alice")]
    state = run_state(RUN, glance(50.0, 2, 2), history, board, 51.0)
    json.dumps(state, allow_nan=False)
    status = state["status"]
    assert (status["epoch"], status["trainers"], status["auxiliary"], status["clients"]) == \
        (2, 3, 1, 1)
    assert status["eta_seconds"] == pytest.approx(7.0) and status["loss"] == 2.5
    assert status["paths"] == {"direct": 1, "hole-punched": 1, "relayed": 1, "unknown": 1}
    assert [p["role"] for p in state["peers"]] == ["trainer", "trainer", "trainer", "auxiliary"]
    assert state["peers"][0]["name"] == "alice" and state["peers"][0]["age"] == 2.0
    assert state["leaderboard"][0]["name"] == "alice"
    assert state["epochs"] == []
    empty = run_state(RUN, None, History(), [], 1.0)
    assert empty["status"] is None and empty["peers"] == [] and empty["points"] == []
