"""The progress logic without a network: the global view, the publish policy, the rate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pdl.errors import ConfigError
from p2pdl.progress import (
    PeerReport,
    ProgressConfig,
    ProgressView,
    PublishPolicy,
    RateEMA,
    Verdict,
    check_role_caps,
    quorum_epoch,
)
from p2pdl.service import Role

ME = b"me"
T = 1_000_000.0


def report(peer: bytes, samples: int, sps: float = 0.0, time: float = T, epoch: int = 0,
           client: bool = False, aux: bool = False) -> PeerReport:
    return PeerReport(peer, epoch, samples, sps, time, client, aux)


def view(target: int = 1000, **config) -> ProgressView:
    return ProgressView(ME, target, ProgressConfig(**config))


def test_counts_are_summed_and_extrapolated_by_rate():
    v = view()
    v.set_local(report(ME, 100, 10.0, T))
    assert v.offer(report(b"a", 200, 20.0, T), T, live=True) is Verdict.ACCEPTED
    assert v.offer(report(b"b", 50, 0.0, T), T, live=True) is Verdict.ACCEPTED
    g = v.global_progress(T + 2)
    assert g.samples_accumulated == 350          # reported: facts only
    assert g.estimated_samples == pytest.approx(350 + 2 * 20)  # not the local peer's
    assert g.num_peers == 3 and g.samples_per_second == 30.0


def test_local_count_is_a_fact_not_extrapolated():
    v = view()
    v.set_local(report(ME, 100, 10.0, T))
    g = v.global_progress(T + 3)
    assert g.estimated_samples == 100 and g.eta_next_epoch == pytest.approx(T + 3 + 90)


def test_eta_is_remaining_over_total_rate():
    v = view(target=1000)
    v.set_local(report(ME, 300, 50.0, T))
    v.offer(report(b"a", 200, 50.0, T), T, live=True)
    g = v.global_progress(T)
    assert g.eta_next_epoch == pytest.approx(T + 500 / 100)
    assert not g.ready_to_step
    # No new facts: the estimate crosses the target at T+10 (the local count
    # is a fact and stays at 300; peer a is extrapolated at 50/s), and the
    # ETA alone makes the peer ready only eta_grace after that.
    assert v.global_progress(T + 9).eta_next_epoch == pytest.approx(T + 9.5)
    assert v.global_progress(T + 10.3).eta_next_epoch == pytest.approx(T + 10)
    assert not v.global_progress(T + 10.4).ready_to_step
    assert v.global_progress(T + 10.6).ready_to_step


def test_no_rate_means_no_eta():
    v = view()
    v.set_local(report(ME, 10, 0.0, T))
    g = v.global_progress(T + 100)
    assert g.eta_next_epoch == math.inf and not g.ready_to_step


def test_ready_when_reported_count_reaches_target():
    v = view(target=1000)
    v.set_local(report(ME, 400, 0.0, T))
    v.offer(report(b"a", 599, 0.0, T), T, live=True)
    assert not v.global_progress(T).ready_to_step
    v.offer(report(b"a", 600, 0.0, T + 0.1), T + 0.1, live=True)
    assert v.global_progress(T + 0.1).ready_to_step


def test_silent_peers_expire():
    v = view(report_ttl=15.0)
    v.set_local(report(ME, 0, 0.0, T))
    v.offer(report(b"a", 500, 1.0, T), T, live=True)
    assert v.global_progress(T + 14).num_peers == 2
    g = v.global_progress(T + 16)
    assert g.num_peers == 1 and g.samples_accumulated == 0
    assert v.expire(T + 16) == [b"a"] and len(v) == 0


def test_global_epoch_is_the_highest_epoch_of_non_client_peers():
    v = view(target=1000)
    v.set_local(report(ME, 100, 10.0, T, epoch=3))
    v.offer(report(b"client", 50, 10.0, T, epoch=9, client=True), T, live=True)
    g = v.global_progress(T)
    assert g.epoch == 3 and not g.ready_to_step and g.num_clients == 1
    v.offer(report(b"a", 20, 10.0, T, epoch=4), T, live=True)
    g = v.global_progress(T)
    # A newer epoch exists: ready at once; only peers at epoch 4 count.
    assert g.epoch == 4 and g.ready_to_step and g.samples_accumulated == 20
    # ... but every live peer's rate counts towards the ETA.
    assert g.samples_per_second == 30.0


def test_peers_behind_do_not_count_towards_the_target():
    v = view(target=100)
    v.set_local(report(ME, 10, 0.0, T, epoch=5))
    v.offer(report(b"old", 1000, 0.0, T, epoch=4), T, live=True)
    g = v.global_progress(T)
    assert g.epoch == 5 and g.samples_accumulated == 10 and not g.ready_to_step


@pytest.mark.parametrize("skew", [-2.0, 2.0])
def test_clock_skew_of_two_seconds_is_absorbed(skew):
    """A peer whose clock is ``skew`` s off: its live reports teach the offset."""
    v = view(target=10_000)
    v.set_local(report(ME, 0, 0.0, T))
    # The peer's clock reads T + skew when ours reads T.
    assert v.offer(report(b"a", 100, 10.0, T + skew), T, live=True) is Verdict.ACCEPTED
    assert v.global_progress(T + 1).estimated_samples == pytest.approx(110, abs=0.5)
    # A later report of it, relayed (not live), is placed by the learned offset.
    assert v.offer(report(b"a", 200, 10.0, T + 5 + skew), T + 8, live=False) is Verdict.ACCEPTED
    assert v.global_progress(T + 8).estimated_samples == pytest.approx(230, abs=0.5)


def test_unknown_offset_never_places_a_report_after_its_arrival():
    v = view(target=10_000)
    v.set_local(report(ME, 0, 0.0, T))
    v.offer(report(b"a", 100, 10.0, T + 2), T, live=False)  # clock 2 s ahead, offset unknown
    assert v.global_progress(T + 1).estimated_samples == pytest.approx(110)


def test_absurd_reports_are_refused():
    v = view(max_samples_per_second=1e6, max_clock_skew=10.0)
    cases = [report(b"a", -1), report(b"a", 1, -5.0), report(b"a", 1, 2e6),
             report(b"a", 1, math.nan), report(b"a", 1, time=T + 60),
             report(b"a", 1, epoch=-1), report(b"a", 2**60)]
    for bad in cases:
        assert v.offer(bad, T) is Verdict.ABSURD, bad
    # Samples from an auxiliary peer are beyond its role (and its sender is flagged).
    assert v.offer(report(b"a", 5, aux=True), T) is Verdict.IMPOSSIBLE
    assert v.last_problem[0] == "impossible_samples"
    assert len(v) == 0
    assert v.offer(report(b"a", 1, time=T + 9), T) is Verdict.ACCEPTED  # within the skew


def test_older_and_own_reports_are_ignored():
    v = view()
    assert v.offer(report(b"a", 10, time=T + 1), T + 1) is Verdict.ACCEPTED
    assert v.offer(report(b"a", 20, time=T), T + 1) is Verdict.STALE
    assert v.offer(report(b"a", 10, time=T + 1), T + 1) is Verdict.STALE
    assert v.offer(report(b"a", 0, time=T, epoch=1), T + 1) is Verdict.ACCEPTED  # new epoch
    assert v.offer(report(ME, 10), T) is Verdict.SELF
    assert v.offer(report(b"b", 1, time=T - 100), T) is Verdict.STALE  # older than report_ttl


def test_view_is_bounded():
    v = view(max_peers=4)
    for i in range(3):
        assert v.offer(report(bytes([i]), 1), T) is Verdict.ACCEPTED
    assert v.offer(report(b"x", 1), T) is Verdict.FULL
    # Expired peers make room.
    assert v.offer(report(b"x", 1, time=T + 20), T + 20) is Verdict.ACCEPTED


@given(st.lists(st.tuples(st.integers(0, 10_000), st.floats(0, 1000), st.floats(0, 9)),
                min_size=1, max_size=20), st.floats(0, 5))
def test_estimate_is_never_below_the_reported_count(peers, later):
    v = view(target=10**6)
    v.set_local(report(ME, 0, 0.0, T))
    for i, (samples, sps, age) in enumerate(peers):
        v.offer(report(i.to_bytes(2, "big"), samples, sps, T - age), T, live=False)
    g = v.global_progress(T + later)
    assert g.estimated_samples >= g.samples_accumulated
    assert g.samples_accumulated == sum(s for s, _, _ in peers)


def test_rate_ema_follows_a_steady_rate():
    ema = RateEMA(half_life=5.0)
    now = T
    ema.update(0, now)
    for _ in range(40):
        now += 0.5
        ema.update(32, now)
    assert ema.rate == pytest.approx(64, rel=0.01) and ema.batch == pytest.approx(32, rel=0.01)


class TestPublishPolicy:
    config = ProgressConfig(heartbeat_interval=5.0, min_publish_interval=0.05,
                            drift_fraction=0.01, drift_batches=1.5, endgame_time=1.0)

    def progress(self, eta: float = T + 100, peers: int = 4, target: int = 4096):
        v = ProgressView(ME, target, self.config)
        g = v.global_progress(T)
        import dataclasses
        return dataclasses.replace(g, eta_next_epoch=eta, num_peers=peers)

    def test_first_report_and_new_epoch_go_out_at_once(self):
        p = PublishPolicy(self.config)
        local = report(ME, 0, 0.0, T)
        assert p.next_publish(local, self.progress(), 0.0, T) <= T
        p.published(local, T)
        assert p.next_publish(report(ME, 0, 0.0, T + 1, epoch=1), self.progress(), 0, T + 1) \
            <= T + 1

    def test_a_correct_prediction_waits_for_the_heartbeat(self):
        p = PublishPolicy(self.config)
        p.published(report(ME, 100, 10.0, T), T)
        # At T+2 the count is 120, as predicted: nothing to say before the heartbeat.
        due = p.next_publish(report(ME, 120, 10.0, T + 2), self.progress(), 10.0, T + 2)
        assert T + 2 < due <= T + 5.0

    def test_drift_beyond_tolerance_publishes(self):
        p = PublishPolicy(self.config)
        p.published(report(ME, 100, 10.0, T), T)
        # The peer sped up: 200 instead of the predicted 120 (tolerance ~15).
        assert p.next_publish(report(ME, 200, 10.0, T + 2), self.progress(), 10.0, T + 2) \
            <= T + 2

    def test_a_stalled_peer_publishes_when_the_prediction_outruns_it(self):
        p = PublishPolicy(self.config)
        p.published(report(ME, 100, 10.0, T), T)
        due = p.next_publish(report(ME, 100, 10.0, T), self.progress(), 10.0, T + 0.1)
        # tolerance = max(0.01 * 4096 / 4, 1.5 * 10, 1) = 15 -> 1.5 s after the report
        assert due == pytest.approx(T + 1.5)

    def test_endgame_publishes_every_change_but_not_faster_than_the_bound(self):
        p = PublishPolicy(self.config)
        p.published(report(ME, 100, 10.0, T), T)
        near = self.progress(eta=T + 0.5)
        assert p.next_publish(report(ME, 101, 10.0, T + 0.01), near, 10.0, T + 0.01) \
            == pytest.approx(T + 0.05)
        # No change, no report (besides the drift rules).
        assert p.next_publish(report(ME, 100, 10.0, T + 0.01), near, 10.0, T + 0.01) > T + 0.05


def test_config_is_checked():
    with pytest.raises(ConfigError):
        ProgressConfig(heartbeat_interval=0)
    with pytest.raises(ConfigError):
        ProgressConfig(heartbeat_interval=20, report_ttl=15)
    with pytest.raises(ConfigError):
        ProgressConfig(max_peers=0)
    with pytest.raises(ConfigError):
        ProgressConfig(eta_grace=math.nan)


def test_endgame_by_missing_samples_even_when_the_rates_are_wrong():
    config = ProgressConfig(endgame_fraction=0.05, endgame_time=1.5)
    p = PublishPolicy(config)
    p.published(report(ME, 990, 1.0, T), T)
    v = ProgressView(ME, 16_000, config)
    v.set_local(report(ME, 1000, 1.0, T + 0.3))
    for i in range(15):
        v.offer(report(bytes([i]), 990, 1.0, T), T, live=True)
    g = v.global_progress(T + 0.3)
    assert g.eta_next_epoch - (T + 0.3) > 5      # the rates say "far"
    # ... but 150 samples of 16000 are missing: every change is published.
    assert p.next_publish(report(ME, 1000, 1.0, T + 0.3), g, 10.0, T + 0.3) <= T + 0.3


# -- the epoch by quorum ------------------------------------------------------------------

@pytest.mark.parametrize("epochs, fraction, expected", [
    ([], 0.5, None),
    ([4], 0.5, 4),              # a lone trainer is its own quorum
    ([4, 9], 0.5, 4),           # two: no strict majority beyond both
    ([4, 4, 9], 0.5, 4),
    ([4, 5, 9], 0.5, 5),        # three: the median
    ([3, 4, 5, 9], 0.5, 4),     # four: three of them must have reached it
    ([4, 4, 5, 5], 0.5, 4),
    ([4, 5, 5, 5], 0.5, 5),
    ([3, 4, 5, 9], 0.0, 9),     # fraction 0: the highest (the rule before quorums)
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.7, 3),   # more than 7 of 10 at >= 3
])
def test_quorum_epoch_table(epochs, fraction, expected):
    assert quorum_epoch(epochs, fraction) == expected


@given(st.lists(st.integers(0, 50), min_size=1, max_size=30),
       st.sampled_from([0.0, 0.25, 0.3, 0.5, 0.6, 2 / 3, 0.7, 0.9]))
def test_quorum_epoch_is_the_highest_epoch_more_than_the_fraction_reached(epochs, fraction):
    q = quorum_epoch(epochs, fraction)
    assert q in epochs
    assert sum(e >= q for e in epochs) > fraction * len(epochs)
    for higher in {e for e in epochs if e > q}:
        assert not sum(e >= higher for e in epochs) > fraction * len(epochs)


def trainers(v: ProgressView, epochs: dict[bytes, int], samples: int = 10) -> None:
    for peer, epoch in epochs.items():
        assert v.offer(report(peer, samples, 1.0, T, epoch=epoch), T, live=True) \
            is Verdict.ACCEPTED


def test_an_epoch_liar_among_honest_peers_moves_nobody():
    v = view(target=1000)
    v.set_local(report(ME, 100, 1.0, T, epoch=7))
    trainers(v, {b"a": 7, b"b": 7, b"c": 7})
    v.offer(report(b"liar", 900, 1.0, T, epoch=10**6), T, live=True)
    g = v.global_progress(T)
    assert g.quorum_epoch == 7 and g.epoch == 7 and g.ahead == {b"liar"}
    # Not a newer epoch, not samples towards the target, not a rate towards the ETA.
    assert not g.ready_to_step and g.samples_accumulated == 130
    assert g.samples_per_second == 4.0


def test_a_peer_one_epoch_ahead_of_the_quorum_makes_the_others_ready():
    v = view(target=1000)
    v.set_local(report(ME, 100, 1.0, T, epoch=7))
    trainers(v, {b"a": 7, b"b": 7, b"c": 8})      # c has just stepped
    g = v.global_progress(T)
    assert g.quorum_epoch == 7 and g.epoch == 8 and g.ready_to_step and not g.ahead
    assert g.samples_accumulated == 10             # only c is at epoch 8


def test_a_liar_two_epochs_ahead_is_ahead_and_a_liar_one_ahead_is_not():
    v = view()
    v.set_local(report(ME, 0, 0.0, T, epoch=3))
    trainers(v, {b"a": 3, b"b": 3, b"liar": 5})
    assert v.global_progress(T).ahead == {b"liar"}
    # A report's epoch never goes back in the view: the liar stays ahead.
    assert v.offer(report(b"liar", 0, 0.0, T + 1, epoch=4), T + 1, live=True) is Verdict.STALE
    v.forget(b"liar")
    v.offer(report(b"liar2", 0, 0.0, T + 1, epoch=4), T + 1, live=True)
    # One ahead looks like a peer that just stepped: a limit of the rule.
    g = v.global_progress(T + 1)
    assert not g.ahead and g.epoch == 4 and g.ready_to_step


def test_two_peers_a_lone_honest_peer_ignores_a_liar_far_ahead():
    v = view()
    v.set_local(report(ME, 50, 1.0, T, epoch=4))     # it has an epoch of its own: it votes
    trainers(v, {b"liar": 9})
    g = v.global_progress(T)
    assert g.quorum_epoch == 4 and g.epoch == 4 and g.ahead == {b"liar"}
    assert not g.ready_to_step


def test_a_joiner_that_does_not_vote_follows_the_swarm_it_joins():
    v = view()
    v.set_local(report(ME, 0, 0.0, T - 5.0, epoch=0), votes=False)   # tracking for join_wait
    v.set_local(report(ME, 0, 0.0, T, epoch=0), votes=False)
    trainers(v, {b"a": 40})          # even a single veteran: the joiner is no evidence
    g = v.global_progress(T)
    assert g.quorum_epoch == 40 and g.epoch == 40 and g.ready_to_step
    v.set_local(report(ME, 0, 0.0, T, epoch=0), votes=False)
    trainers(v, {b"b": 40, b"c": 39})
    assert v.global_progress(T).epoch == 40


def joining_view(epochs: dict[bytes, int], *, waited: float) -> ProgressView:
    """A fresh local peer (abstaining, at epoch 0) that started tracking ``waited`` s
    before T, and heard ``epochs`` at T."""
    v = view(join_wait=5.0)
    v.set_local(report(ME, 0, 0.0, T - waited, epoch=0), votes=False)
    v.set_local(report(ME, 0, 0.0, T, epoch=0), votes=False)
    trainers(v, epochs)
    return v


LIAR = 10**6


@pytest.mark.parametrize("heard, waited, quorum, epoch, ready, ahead", [
    # a fresh run, the liar heard first: the fresh peer waits for the swarm
    ({b"liar": LIAR}, 1.0, LIAR, 0, False, set()),
    # ... which it hears within join_wait: two honest voices at 0 outvote it
    ({b"liar": LIAR, b"a": 0, b"b": 0}, 5.0, 0, 0, False, {b"liar"}),
    # still only the liar after join_wait: word against word, it follows
    ({b"liar": LIAR}, 5.0, LIAR, LIAR, True, set()),
    # a veteran swarm and one joiner: it follows once join_wait has passed
    ({b"v": 40}, 1.0, 40, 0, False, set()),
    ({b"v": 40}, 5.0, 40, 40, True, set()),
    ({b"v1": 40, b"v2": 41}, 5.0, 40, 41, True, set()),
    # two veterans and two joiners (the other joiner votes at 0): it follows
    ({b"v1": 40, b"v2": 40, b"j": 0}, 5.0, 40, 40, True, set()),
    # one veteran and two joiners: the joiners outvote it and do not follow
    ({b"v": 40, b"j": 0}, 5.0, 0, 0, False, {b"v"}),
], ids=["liar-first", "fresh-run-liar", "liar-alone", "joiner-waiting", "joiner",
        "joiner-of-two", "two-veterans-two-joiners", "one-veteran-two-joiners"])
def test_a_fresh_peer_follows_only_after_join_wait(heard, waited, quorum, epoch, ready, ahead):
    g = joining_view(heard, waited=waited).global_progress(T)
    assert (g.quorum_epoch, g.epoch, g.ready_to_step, set(g.ahead)) == \
        (quorum, epoch, ready, ahead)


def test_a_fresh_run_steps_within_join_wait_and_a_held_peer_wakes_at_its_end():
    # Nobody beyond the local epoch: nothing is held, the target makes it ready.
    v = joining_view({b"a": 0, b"b": 0}, waited=1.0)
    v.set_local(report(ME, 980, 0.0, T, epoch=0), votes=False)
    assert v.global_progress(T).ready_to_step
    # Held by a higher epoch: it is due to look again when join_wait ends.
    v = joining_view({b"liar": LIAR}, waited=1.0)
    assert v.ready_at(T) == T + 4.0
    assert v.global_progress(T + 4.0).epoch == LIAR


def test_a_joiner_does_not_step_on_reports_older_than_its_start():
    """A DHT snapshot holds reports up to report_ttl old: the swarm at epoch 0,
    long left.  A joiner that stepped on them would found its own group at 0."""
    v = view(join_wait=5.0, target=100)
    v.set_local(report(ME, 0, 0.0, T - 1.0, epoch=0), votes=False)   # tracking since T - 1
    v.set_local(report(ME, 200, 50.0, T, epoch=0), votes=False)      # its own target reached
    for peer in (b"a", b"b", b"c"):   # stamped 12 s before it started, not live
        assert v.offer(report(peer, 0, 10.0, T - 13.0, epoch=0), T) is Verdict.ACCEPTED
    g = v.global_progress(T)
    assert g.num_peers == 4 and g.epoch == 0 and not g.ready_to_step
    assert v.ready_at(T) == T + 4.0     # join_wait's end, unless a fresh report comes first
    # one fresh report (a push's reply) says where the swarm is now
    trainers(v, {b"a": 7})
    g = v.global_progress(T)
    assert g.epoch == 0 and not g.ready_to_step   # held: epoch 7 is more than one beyond
    assert v.global_progress(T + 4.0).epoch == 7
    # at the start of a run, peers that started together hear each other live at once
    fresh = joining_view({b"a": 0, b"b": 0}, waited=1.0)
    fresh.set_local(report(ME, 980, 0.0, T, epoch=0), votes=False)
    assert fresh.global_progress(T).ready_to_step


def test_a_peer_with_an_epoch_of_its_own_does_not_wait():
    v = view(join_wait=5.0)
    v.set_local(report(ME, 0, 0.0, T, epoch=3))       # resumed a checkpoint: it votes at once
    trainers(v, {b"a": 4})
    g = v.global_progress(T)
    assert g.epoch == 4 and g.ready_to_step


def test_join_wait_is_bounded_by_report_ttl():
    with pytest.raises(ConfigError):
        ProgressConfig(join_wait=16.0, report_ttl=15.0)


def test_a_peer_ahead_of_the_quorum_keeps_its_own_epoch():
    # A veteran among joiners that are the majority: it does not go back.
    v = view()
    v.set_local(report(ME, 10, 1.0, T, epoch=40))
    trainers(v, {b"a": 0, b"b": 0})
    g = v.global_progress(T)
    assert g.quorum_epoch == 0 and g.epoch == 40 and not g.ahead
    assert g.samples_accumulated == 10 and not g.ready_to_step


def test_clients_and_auxiliary_peers_do_not_vote():
    v = view()
    v.set_local(report(ME, 0, 0.0, T, epoch=2))
    v.offer(report(b"aux", 0, 0.0, T, epoch=2, aux=True), T, live=True)
    v.offer(report(b"c1", 0, 0.0, T, epoch=2, client=True), T, live=True)
    v.offer(report(b"c2", 0, 0.0, T, epoch=2, client=True), T, live=True)
    trainers(v, {b"a": 6})
    # Voters: this peer (2) and a (6): the quorum is 2, a is ahead.
    g = v.global_progress(T)
    assert g.quorum_epoch == 2 and g.ahead == {b"a"} and g.epoch == 2


@given(st.integers(0, 1000), st.lists(st.booleans(), min_size=0, max_size=8),
       st.lists(st.integers(2, 10**6), min_size=0, max_size=8))
def test_liars_fewer_than_the_honest_move_nobody_beyond_one_epoch(epoch, honest_ahead, lies):
    """Honest trainers at E or E+1 (this one at E), liars anywhere above: with the
    honest a strict majority, the epoch is at most one beyond what the honest reached."""
    if not len(lies) < len(honest_ahead) + 1:
        lies = lies[:len(honest_ahead)]
    v = view()
    v.set_local(report(ME, 0, 0.0, T, epoch=epoch))
    for i, stepped in enumerate(honest_ahead):
        v.offer(report(b"h%d" % i, 0, 0.0, T, epoch=epoch + stepped), T, live=True)
    for i, lie in enumerate(lies):
        v.offer(report(b"l%d" % i, 0, 0.0, T, epoch=epoch + lie), T, live=True)
    g = v.global_progress(T)
    highest_honest = epoch + max(honest_ahead, default=0)
    assert epoch <= g.quorum_epoch <= highest_honest
    assert g.epoch <= g.quorum_epoch + 1 <= highest_honest + 1
    assert all(b"l%d" % i in g.ahead for i, lie in enumerate(lies)
               if epoch + lie > g.quorum_epoch + 1)


def test_quorum_fraction_is_checked():
    with pytest.raises(ConfigError, match="quorum_fraction"):
        ProgressConfig(quorum_fraction=1.0)


# -- role caps ------------------------------------------------------------------------------

CAPS = dict(max_trainer_samples_per_second=100.0, max_client_samples_per_second=50.0,
            burst_seconds=1.0, first_report_factor=2.0)


def test_a_trainer_rate_above_its_cap_is_impossible():
    v = view(target=1000, **CAPS)
    assert v.offer(report(b"a", 0, 101.0), T) is Verdict.IMPOSSIBLE
    assert v.last_problem[0] == "impossible_rate"
    assert v.offer(report(b"a", 0, 100.0), T) is Verdict.ACCEPTED
    assert v.offer(report(b"c", 0, 60.0, client=True), T) is Verdict.IMPOSSIBLE
    assert v.offer(report(b"c", 0, 50.0, client=True), T) is Verdict.ACCEPTED


def test_a_count_may_grow_at_the_cap_plus_a_burst_within_an_epoch():
    v = view(target=1000, **CAPS)
    assert v.offer(report(b"a", 100, 50.0, T), T, live=True) is Verdict.ACCEPTED
    # 10 s later on this node's clock: at most 100 + 100 * (10 + 1) samples.
    assert v.offer(report(b"a", 1201, 50.0, T + 10), T + 10, live=True) is Verdict.IMPOSSIBLE
    assert v.last_problem[0] == "impossible_samples"
    assert v.offer(report(b"a", 1200, 50.0, T + 10), T + 10, live=True) is Verdict.ACCEPTED
    # The peer's own stamps do not stretch the time: a live report is placed on arrival.
    assert v.offer(report(b"a", 1200 + 900, 50.0, T + 19), T + 11, live=True) \
        is Verdict.IMPOSSIBLE
    # A new epoch starts afresh: its first report is bounded by the target.
    assert v.offer(report(b"a", 2101, 0.0, T + 12, epoch=1), T + 12, live=True) \
        is Verdict.IMPOSSIBLE   # at most 2 * 1000 + 100 * 1
    assert v.offer(report(b"a", 2100, 0.0, T + 12, epoch=1), T + 12, live=True) \
        is Verdict.ACCEPTED


def test_auxiliary_peers_report_no_samples_and_no_rate():
    v = view(**CAPS)
    assert v.offer(report(b"x", 0, 1.0, aux=True), T) is Verdict.IMPOSSIBLE
    assert v.last_problem[0] == "impossible_rate"
    assert v.offer(report(b"x", 3, 0.0, aux=True), T) is Verdict.IMPOSSIBLE
    assert v.last_problem[0] == "impossible_samples"
    assert v.offer(report(b"x", 0, 0.0, aux=True), T) is Verdict.ACCEPTED


def test_a_certified_auxiliary_reporting_as_a_trainer_is_refused():
    v = view(**CAPS)
    assert v.offer(report(b"x", 5, 1.0), T, role=Role.AUXILIARY) is Verdict.IMPOSSIBLE
    assert v.last_problem[0] == "role_mismatch"
    assert v.offer(report(b"x", 0, 0.0, aux=True), T, role=Role.AUXILIARY) is Verdict.ACCEPTED
    # A certified trainer may take the lesser part.
    assert v.offer(report(b"y", 0, 0.0, aux=True), T, role=Role.TRAINER) is Verdict.ACCEPTED


def test_check_role_caps_passes_plausible_reports():
    config = ProgressConfig(**CAPS)
    first = report(b"a", 2000, 100.0)
    assert check_role_caps(first, None, 0.0, None, 1000, config) is None
    later = report(b"a", 2000 + 100 * 6, 100.0, T + 5)
    assert check_role_caps(later, first, 5.0, Role.TRAINER, 1000, config) is None
    # Counts may fall within an epoch (nothing to cap).
    assert check_role_caps(report(b"a", 0, 0.0), first, 0.0, None, 1000, config) is None


class _Members:
    """A run's membership as screening asks it: members, learnable credentials, roles."""

    def __init__(self, members=(), learnable=(), roles=None):
        self.members = set(members)
        self.learnable = set(learnable)
        self.roles = roles or {}

    def is_member(self, peer, run_id):
        return peer in self.members

    def learn(self, peer, run_id, credential):
        if peer in self.learnable and credential == b"credential":
            self.members.add(peer)
            return True
        return False

    def role_of(self, peer, run_id):
        return self.roles.get(peer)


def test_screen_report_is_the_one_check_of_pushed_reports_and_evidence():
    import dataclasses as dc

    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from p2pdl.progress import sign_report
    from p2pdl.progress._state import screen_report
    from p2pdl.service import Role

    keys = create_new_key_pair()
    peer = ID.from_pubkey(keys.public_key)
    config = ProgressConfig()
    now = 1_000_000.0

    def report(**fields):
        signed = sign_report(keys.private_key, peer, "run", 3, 40, 10.0, now, False,
                             credential=fields.pop("credential", None))
        return dc.replace(signed, **fields)

    members = _Members(members=[peer])
    ok = screen_report(report(), now, "run", config, members, learn=False)
    assert ok.drop is None and ok.peer == peer and not ok.learnt
    absurd = screen_report(report(time=now + 3600), now, "run", config, members, learn=True)
    assert absurd.drop == "dropped_absurd" and "ahead" in absurd.reason
    forged = screen_report(report(samples_accumulated=41), now, "run", config, members,
                           learn=True)
    assert forged.drop == "dropped_bad_signature"
    stranger = _Members(learnable=[peer])
    assert screen_report(report(credential=b"credential"), now, "run", config, stranger,
                         learn=False).drop == "dropped_not_member"   # evidence learns nothing
    learnt = screen_report(report(credential=b"credential"), now, "run", config, stranger,
                           learn=True)
    assert learnt.drop is None and learnt.learnt
    monitor = _Members(members=[peer], roles={peer: Role.MONITOR})
    watched = screen_report(report(), now, "run", config, monitor, learn=True)
    assert watched.drop == "ignored_monitor" and watched.role is Role.MONITOR
