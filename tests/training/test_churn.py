"""A swarm whose volunteers are killed and replaced stays one swarm, in one state
(p2pdl.testing.churn_run: sync nodes on loopback, a small regression task)."""

from __future__ import annotations

import pprint

import pytest

from p2pdl.testing import ChurnConfig, churn_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_swarm_through_kills_mid_round_during_downloads_and_plain_ends_in_one_state():
    outcome = churn_run(ChurnConfig(
        peers=5, kills=4, kill_every=4.0, first_kill=4.0,
        kinds=("mid_round", "download", "plain", "mid_round"), settle_epochs=3,
        seconds=200.0,
        # every epoch, each peer compares its state with the others' (the
        # default is every 5): a split mended by that shows in the end state
        options=(("matchmaking_time", 5.0), ("check_state_every", 1))))
    # a string, printed whole when an assertion fails
    summary = pprint.pformat(outcome.summary() | {"peers": [
        (p["slot"], p["generation"], p["statistics"].get("epoch"), p["rounds"][-8:])
        for p in outcome.peers]}, width=100)
    # every kind of kill was made, and every victim was replaced
    assert [kill[1] for kill in outcome.kills] == ["mid_round", "download", "plain",
                                                   "mid_round"], summary
    # the mid-round kills struck while the victim's all-reduce ran
    assert all(caught for _, kind, _, caught in outcome.kills if kind == "mid_round"), summary
    assert outcome.peers_at_end == 5
    # one swarm, one state: every live peer reached the end epoch with the same parameters
    assert outcome.distinct_states_at_end == 1, summary
    # every replacement alive at the end caught up by downloading (one may be killed
    # before it did), none trained on its own parameters
    assert outcome.joiners_not_caught_up == 0 and outcome.joiners_on_own_parameters == 0, \
        summary
    survivors = [p for p in outcome.peers if p["generation"] and p["killed"] is None]
    assert survivors and all(p["caught_up"] is not None for p in survivors), summary
    # (a replacement waits join_wait, 5 s, then downloads; under churn the view it
    # asks by may lag and a download fail, then it tries again every sync_retry)
    assert max(outcome.join_catch_up_s) < 60, summary
    # the swarm kept averaging and learned
    assert outcome.rounds["averaged"] > outcome.rounds["failed"], summary
    assert outcome.loss < outcome.untrained_loss / 3, summary
