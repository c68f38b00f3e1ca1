"""p2pdl.training._state_keeping: the full state, share, fetch, consistency checks and
checkpoints, on a fake node."""

from __future__ import annotations

import contextlib
import hashlib
import io
import time
from types import SimpleNamespace

import pytest
import torch
from libp2p.peer.id import ID

import p2pdl
from p2pdl.errors import ConfigError
from p2pdl.training import CatchUp, OptimizerConfig, StateKeeper
from p2pdl.training._state_keeping import MAX_CHECKS, SPLIT_CHECKS
from p2pdl.training._strategies import make_strategy

from .fake_node import FakeNode, FakeTracker, report

pytestmark = pytest.mark.timeout(30)

PEER_A, PEER_B, PEER_C = b"peer-a", b"peer-b", b"peer-c"


def keeper(node: FakeNode | None = None, weight: float = 1.0, **options: object
           ) -> tuple[StateKeeper, torch.nn.Linear]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(weight)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = OptimizerConfig(**options)
    params = list(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    return StateKeeper(node or FakeNode(), "run", config, optimizer=opt, params=params,
                       scheduler=scheduler, strategy=make_strategy(config, opt, params)), model


def trained(k: StateKeeper, model: torch.nn.Linear, steps: int = 2) -> None:
    for _ in range(steps):
        model(torch.ones(1, 3)).sum().backward()
        k.optimizer.step()
        k.optimizer.zero_grad()
        k.scheduler.step()
        k.epoch += 1


@pytest.mark.parametrize("mode", ["dedloc", "diloco"])
def test_the_full_state_round_trips_through_bytes_and_digests_agree(mode):
    source, model = keeper(mode=mode)
    trained(source, model)
    target, other = keeper(weight=5.0, mode=mode)
    assert target.digest() != source.digest()
    state = torch.load(io.BytesIO(source.serialized()), weights_only=True)
    assert sorted(state) == ["diloco", "epoch", "format", "mode", "optimizer", "params",
                             "scheduler"]
    target.load(state)
    assert target.epoch == 2
    assert torch.equal(other.weight, model.weight)
    assert target.scheduler.state_dict() == source.scheduler.state_dict()
    assert target.digest() == source.digest()   # deterministic serialization
    if mode == "diloco":
        assert sorted(state["diloco"]) == ["anchor", "momentum"]
    else:
        assert state["diloco"] is None


@pytest.mark.parametrize("change, match", [
    (lambda s: "not a dict", "not a p2pdl optimizer state"),
    (lambda s: {**s, "format": 99}, "not a p2pdl optimizer state"),
    (lambda s: {**s, "mode": "diloco"}, "of mode 'diloco'"),
    (lambda s: {**s, "epoch": -1}, "epoch is invalid"),
    (lambda s: {**s, "params": s["params"][:1]}, "parameters do not match"),
    (lambda s: {**s, "params": [torch.zeros(4, 4), s["params"][1]]}, "parameters tensor 0"),
    (lambda s: {**s, "optimizer": {"state": {}, "param_groups": []}}, "optimizer state"),
])
def test_a_state_that_does_not_fit_is_refused_and_nothing_is_loaded(change, match):
    source, _ = keeper(weight=2.0)
    source.epoch = 3
    target, model = keeper(weight=1.0)
    with pytest.raises(ConfigError, match=match):
        target.load(change(source.full_state()))
    assert target.epoch == 0 and bool((model.weight == 1.0).all())


def test_a_diloco_state_needs_the_outer_state():
    source, _ = keeper(mode="diloco")
    target, _ = keeper(mode="diloco")
    with pytest.raises(ConfigError, match="DiLoCo outer state"):
        target.load({**source.full_state(), "diloco": None})


def test_servers_share_every_n_epochs_clients_and_auxiliary_peers_never():
    node = FakeNode()
    k, _ = keeper(node, share_state_every=2)
    k.epoch = 1
    k.share()
    assert node.statesync.shared == []
    k.share(force=True)
    k.epoch = 2
    k.after_step()
    assert [(e, len(p) > 0) for _, e, p in node.statesync.shared] == [(1, True), (2, True)]
    assert k.statistics()["shared"] == 2
    assert k.digest() == hashlib.sha256(node.statesync.shared[-1][2]).digest()
    client = FakeNode(client_mode=True)
    keeper(client)[0].share(force=True)
    helper = FakeNode()
    keeper(helper, auxiliary=True)[0].share(force=True)
    assert client.statesync.shared == [] and helper.statesync.shared == []


def test_catching_up_downloads_from_serving_peers_ahead():
    node = FakeNode()
    source, model = keeper()
    trained(source, model, steps=3)
    node.statesync.payloads.append((3, source.serialized()))
    k, mine = keeper(node, weight=7.0)
    k.mark_suspect()
    tracker = FakeTracker(reports=[report(PEER_A, 3), report(PEER_B, 3, client_mode=True),
                                   report(PEER_C, 3, auxiliary=True), report(b"old", 1)])
    assert k.catch_up(tracker, 3) is CatchUp.SYNCED
    (fetch,) = node.statesync.fetched
    assert fetch["donors"] == [ID(PEER_A)] and fetch["min_epoch"] == 3
    assert fetch["timeout"] == k.config.sync_timeout
    assert k.epoch == 3 and torch.equal(mine.weight, model.weight) and not k.suspect
    assert k.statistics()["state_syncs"] == 1


@pytest.mark.parametrize("view, max_epoch", [
    (SimpleNamespace(epoch=10**6, quorum_epoch=3), 4),   # the quorum bounds the epoch asked
    (SimpleNamespace(epoch=3), 4),                        # no quorum: the view's epoch
    (SimpleNamespace(epoch=10**6, quorum_epoch=1), 3),    # never below min_epoch
])
def test_catching_up_asks_for_no_epoch_past_the_quorums_next(view, max_epoch):
    node = FakeNode()
    source, _ = keeper()
    source.epoch = 3
    node.statesync.payloads.append((3, source.serialized()))
    k, _ = keeper(node)
    tracker = FakeTracker(view=[view], reports=[report(PEER_A, 3), report(PEER_B, 10**6)])
    assert k.catch_up(tracker, 3) is CatchUp.SYNCED
    (fetch,) = node.statesync.fetched
    assert fetch["min_epoch"] == 3 and fetch["max_epoch"] == max_epoch
    # every serving peer is asked: state sync flags those past the bound
    assert fetch["donors"] == [ID(PEER_A), ID(PEER_B)]


def test_a_state_from_a_lone_donor_is_checked_after_the_next_round():
    node = FakeNode()
    node.statesync.lone_unconfirmed = True
    source, _ = keeper()
    source.epoch = 3
    node.statesync.payloads += [(3, source.serialized())] * 2
    k, _ = keeper(node)
    tracker = FakeTracker(reports=[report(PEER_A, 3)])
    assert k.download(tracker, 3)
    assert k.unconfirmed and not k.suspect and k.statistics()["unconfirmed_syncs"] == 1
    k.share(force=True)   # not offered to others while unconfirmed
    assert node.statesync.shared == []
    k.epoch += 1
    k.after_step()   # the next round: now compare with the others
    assert k.suspect and not k.unconfirmed
    assert [e for _, e, _ in node.statesync.shared] == [4]
    # A download two donors agreed on is confirmed.
    k2, _ = keeper(node)
    assert k2.download(FakeTracker(reports=[report(PEER_A, 3), report(PEER_B, 3)]), 3)
    assert not k2.unconfirmed and k2.statistics()["unconfirmed_syncs"] == 0


def test_a_download_whose_payload_is_not_its_digest_is_not_loaded():
    class Lying(type(FakeNode().statesync)):
        def fetch(self, *args, **kwargs):
            download = super().fetch(*args, **kwargs)
            download.digest = bytes(32)
            return download
    node = FakeNode(statesync=Lying())
    source, _ = keeper(weight=4.0)
    source.epoch = 3
    node.statesync.payloads.append((3, source.serialized()))
    k, model = keeper(node)
    assert not k.download(FakeTracker(reports=[report(PEER_A, 3)]), 3)
    assert k.epoch == 0 and bool((model.weight == 1.0).all())
    assert k.statistics()["state_sync_failures"] == 1


LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("liar_epoch", [10**6, 3])   # far newer; the same epoch
def test_a_lying_donor_serving_poison_loses_to_two_honest_ones_over_real_nodes(liar_epoch):
    honest_state, honest_model = keeper(weight=2.0)
    trained(honest_state, honest_model, steps=3)
    liar_state, _ = keeper(weight=99.0)   # finite parameters of the right shapes
    liar_state.epoch = liar_epoch
    with contextlib.ExitStack() as stack:
        joiner, liar, *honest = (stack.enter_context(p2pdl.Node(listen=LOOPBACK))
                                 for _ in range(4))
        for node in (liar, *honest):
            joiner.connect(node.addrs[0], timeout=20)
            node.statesync.share("run", liar_epoch if node is liar else 3,
                                  (liar_state if node is liar else honest_state).serialized())
        reports = [report(liar.peer_id.to_bytes(), liar_epoch)] + \
            [report(n.peer_id.to_bytes(), 3) for n in honest]
        tracker = FakeTracker(view=[SimpleNamespace(epoch=3, quorum_epoch=3)], reports=reports)
        k, mine = keeper(joiner, weight=7.0, sync_timeout=30.0)
        assert k.download(tracker, 3)
        assert k.epoch == 3 and torch.equal(mine.weight, honest_model.weight)
        assert not k.unconfirmed
        flags = joiner.trio_node.flags
        assert flags.count(liar.peer_id, "state_lost_vote") == 1
        assert all(flags.count(n.peer_id) == 0 for n in honest)
        # Again: the liar's offer is left out, nothing of it is downloaded.
        assert k.download(tracker, 3)
        assert liar.statesync.statistics()["chunks_served"] == 0
        assert joiner.statesync.statistics()["offers_excluded"] == 1
        assert flags.count(liar.peer_id) == 1


def test_catching_up_waits_between_failures_and_never_adopts_the_epoch():
    """A joiner whose downloads fail keeps trying: trained on at the swarm's epoch,
    its own parameters would be a state nobody else holds."""
    node = FakeNode()
    k, _ = keeper(node, sync_retry=0.01)
    tracker = FakeTracker(reports=[report(PEER_A, 5)])
    verdicts = []
    for _ in range(6):
        verdicts.append(k.catch_up(tracker, 5))
        verdicts.append(k.catch_up(tracker, 5))   # too soon: no new attempt
        time.sleep(0.02)
    assert verdicts == [CatchUp.WAIT] * 12
    assert len(node.statesync.fetched) == 6
    assert k.statistics()["state_sync_failures"] == 6
    assert k.epoch == 0
    garbage = FakeNode()
    garbage.statesync.payloads.append((5, b"not a torch file"))
    g, _ = keeper(garbage)
    assert not g.download(tracker, 5)
    assert g.statistics()["state_sync_failures"] == 1
    # Without state sync there is nothing to wait for: the epoch is adopted.
    assert keeper(state_sync=False)[0].catch_up(tracker, 5) is CatchUp.ADOPT
    assert not k.download(FakeTracker(), 5)   # nobody to ask


def test_the_consistency_check_downloads_the_majoritys_state():
    node = FakeNode()
    agreed, model = keeper(weight=2.0)
    agreed.epoch = 4
    k, mine = keeper(node, weight=3.0)
    k.epoch = 4
    k.mark_suspect()
    assert k.check_due()
    theirs = agreed.digest()
    node.statesync.offered = {ID(PEER_A): (4, theirs), ID(PEER_B): (4, theirs),
                               ID(PEER_C): (3, b"older")}
    node.statesync.payloads.append((4, agreed.serialized()))
    tracker = FakeTracker(reports=[report(PEER_A, 4), report(PEER_B, 4), report(PEER_C, 4)])
    assert k.check_consistency(tracker)
    (fetch,) = node.statesync.fetched
    assert fetch["digest"] == theirs and set(fetch["donors"]) == {ID(PEER_A), ID(PEER_B)}
    assert torch.equal(mine.weight, model.weight) and not k.suspect and not k.check_due()
    assert k.statistics()["consistency_checks"] == 1 and k.statistics()["repairs"] == 1


def test_a_tie_goes_to_the_smallest_digest():
    for other, downloads in [(b"\xff" * 32, 0), (b"\x00" * 32, 1)]:
        node = FakeNode()
        k, _ = keeper(node)
        k.mark_suspect()
        node.statesync.offered = {ID(PEER_A): (0, other)}   # one against one
        assert not k.check_consistency(FakeTracker(reports=[report(PEER_A, 0)]))
        assert [f["digest"] for f in node.statesync.fetched] == [other] * downloads
        assert not k.suspect and k.statistics()["consistency_checks"] == 1
        assert k.statistics()["state_sync_failures"] == downloads   # the fake has no payload


def split(epoch: int = 3) -> tuple[dict[ID, tuple[int, bytes]], dict[bytes, tuple[int, bytes]],
                                   list[StateKeeper]]:
    """Three peers at ``epoch`` in three states (weights 2, 3 and a liar's 1e6): their
    offers and payloads, and the keepers."""
    keepers = []
    for weight in (2.0, 3.0, 1e6):
        k, model = keeper(weight=weight)
        trained(k, model, epoch)
        keepers.append(k)
    offered = {ID(peer): (epoch, k.digest())
               for peer, k in zip((PEER_A, PEER_B, PEER_C), keepers, strict=True)}
    payloads = {k.digest(): (epoch, k.serialized()) for k in keepers}
    return offered, payloads, keepers


def seen_by(peer: bytes | None, offered: dict[ID, tuple[int, bytes]],
            payloads: dict[bytes, tuple[int, bytes]]) -> FakeNode:
    """A node whose state sync sees every offer but ``peer``'s own (None: all of
    them) and downloads each offered state by its digest."""
    node = FakeNode()
    node.statesync.by_digest = dict(payloads)
    node.statesync.offered = {p: o for p, o in offered.items()
                               if peer is None or p != ID(peer)}
    return node


def test_peers_that_agree_on_no_state_merge_them_alike_and_a_liar_is_outvoted():
    offered, payloads, (a, b, liar) = split()
    reports = [report(PEER_A, 3), report(PEER_B, 3), report(PEER_C, 3)]
    digests = {}
    for me, peer in ((a, PEER_A), (b, PEER_B)):
        node = seen_by(peer, offered, payloads)
        me.node = node
        me.mark_suspect()
        assert me.check_consistency(FakeTracker(reports=reports))
        assert me.statistics()["merges"] == 1 and not me.suspect and me.epoch == 3
        # the two other states were downloaded, each from its holder, by digest
        assert len(node.statesync.fetched) == 2
        # the merged state is not offered before the next step (the others still
        # see this peer's old offer, so they compute the same merge)
        me.share(force=True)
        assert node.statesync.shared == []
        digests[peer] = me.digest()
    assert digests[PEER_A] == digests[PEER_B]
    merged = a.params[0]
    # per value, the median of 2, 3 and the liar's 1e6 (trained alike): the liar's
    # values are outvoted, and the result is one of the honest peers' values
    assert torch.equal(merged, b.params[0]) and bool((merged.abs() < 10).all())
    assert float(liar.params[0].detach().min()) > 1e5


def test_a_joiner_facing_donors_that_agree_on_no_state_merges_as_they_do():
    offered, payloads, (a, _, _) = split()
    joiner, _ = keeper(seen_by(None, offered, payloads), weight=-7.0)
    reports = [report(PEER_A, 3), report(PEER_B, 3), report(PEER_C, 3)]
    # the joiner's vote finds no majority (the fake download fails); it merges
    assert joiner.catch_up(FakeTracker(reports=reports), 3) is CatchUp.SYNCED
    assert joiner.epoch == 3 and joiner.statistics()["merges"] == 1
    a.node = seen_by(PEER_A, offered, payloads)
    a.mark_suspect()
    assert a.check_consistency(FakeTracker(reports=reports))
    assert joiner.digest() == a.digest()   # the joiner holds what the peers hold
    # donors that agree: the joiner does not merge, it waits for the download
    agreed = FakeNode()
    digest = offered[ID(PEER_A)][1]
    agreed.statesync.offered = {ID(PEER_A): (3, digest), ID(PEER_B): (3, digest)}
    k, _ = keeper(agreed)
    assert k.catch_up(FakeTracker(reports=reports[:2]), 3) is CatchUp.WAIT
    assert k.statistics()["merges"] == 0


def test_a_merge_that_cannot_download_every_state_changes_nothing():
    offered, payloads, (a, _, _) = split()
    node = FakeNode()
    node.statesync.by_digest = {d: p for d, p in payloads.items()
                                 if d != offered[ID(PEER_C)][1]}
    node.statesync.offered = {p: o for p, o in offered.items() if p != ID(PEER_A)}
    a.node = node
    before = a.digest()
    a.mark_suspect()
    assert not a.check_consistency(FakeTracker(reports=[report(PEER_B, 3),
                                                        report(PEER_C, 3)]))
    assert a.digest() == before and a.statistics()["merges"] == 0
    assert a.suspect   # it checks again soon: the offers may have changed


def test_the_consistency_check_asks_again_while_nobody_offers_then_gives_up():
    node = FakeNode()
    k, _ = keeper(node)
    k.mark_suspect()
    tracker = FakeTracker(reports=[report(PEER_A, 0)])
    assert not k.check_consistency(tracker)
    assert k.suspect and not k.check_due()   # again after CHECK_RETRY
    for _ in range(MAX_CHECKS - 1):
        k.check_consistency(tracker)
    assert not k.suspect and k.statistics()["consistency_checks"] == 0


def test_every_check_state_every_epochs_a_peer_compares_even_after_good_rounds():
    # A split that no round noticed (say, a view that missed the other group)
    # is mended by the routine check: the majority's state is downloaded.
    node = FakeNode()
    agreed, model = keeper(weight=2.0)
    k, mine = keeper(node, weight=3.0, check_state_every=5)
    for epoch, due in [(4, False), (5, True), (6, False), (10, True)]:
        k.epoch = agreed.epoch = epoch
        k.check_routinely(3)
        assert k.suspect is due, epoch
        k.suspect = False
    k.check_routinely(1)   # no other peer seen at the epoch: nothing to compare with
    assert not k.suspect
    k.check_routinely(3)
    theirs = agreed.digest()
    node.statesync.offered = {ID(PEER_A): (10, theirs)}
    node.statesync.payloads.append((10, agreed.serialized()))
    tracker = FakeTracker(reports=[report(PEER_A, 10), report(PEER_B, 10)])
    # it waits for the offers of the peers seen at the last epoch (3 with this one) ...
    assert not k.check_consistency(tracker) and k.suspect and not node.statesync.fetched
    node.statesync.offered[ID(PEER_B)] = (10, theirs)
    # ... then two against one: it takes their state
    assert k.check_consistency(tracker)
    assert torch.equal(mine.weight, model.weight) and not k.suspect
    assert k.statistics()["repairs"] == 1


@pytest.mark.parametrize("options", [{"check_state_every": 0},
                                     {"check_state_every": 4, "share_state_every": 3},
                                     {"auxiliary": True}])
def test_no_routine_check_when_off_at_epochs_nobody_offers_or_on_auxiliary_peers(options):
    k, _ = keeper(**options)
    k.epoch = 4
    k.check_routinely(3)
    assert not k.suspect


def test_a_routine_check_gives_up_sooner_than_a_suspicion_when_nobody_offers():
    node = FakeNode()
    k, _ = keeper(node, check_state_every=1)
    k.epoch = 1
    k.check_routinely(2)
    tracker = FakeTracker(reports=[report(PEER_A, 1)])
    for _ in range(SPLIT_CHECKS):
        assert not k.check_consistency(tracker)
    assert not k.suspect and k.statistics()["consistency_checks"] == 0
    with pytest.raises(ConfigError, match="check_state_every"):
        OptimizerConfig(check_state_every=-1)


def test_checkpoints_are_written_when_due_and_resumed(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        keeper()[0].save_checkpoint()
    node = FakeNode()
    k, model = keeper(node, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert not k.resume()
    for _ in range(4):
        trained(k, model, steps=1)
        k.after_step()
    assert k.statistics()["checkpoints"] == 2
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "checkpoint-0000000002.pt", "checkpoint-0000000004.pt"]
    fresh, other = keeper(checkpoint_dir=tmp_path, weight=9.0)
    assert fresh.resume() and fresh.epoch == 4
    assert torch.equal(other.weight, model.weight)


def test_the_state_is_on_the_cpu_whatever_the_device_so_digests_do_not_depend_on_it():
    """``on_device`` moves every tensor of a state (dicts of their own type,
    lists, tuples) and leaves a state already there as it is (the same
    object: the same bytes, the same digest).  On the CPU the meta device
    stands in for another device type; on a CUDA machine a CPU peer and a GPU
    peer with equal states have one digest, and a state lands on the GPU."""
    from collections import OrderedDict

    from p2pdl.training._state_keeping import on_device

    source, model = keeper()
    trained(source, model)
    state = source.full_state()
    cpu = torch.device("cpu")
    assert on_device(state, cpu) is state
    assert hashlib.sha256(source.serialized()).digest() == source.digest()
    nested = {"a": OrderedDict(b=[torch.ones(2), (torch.zeros(1), 3)]), "c": "text"}
    meta = on_device(nested, torch.device("meta"))
    assert type(meta["a"]) is OrderedDict and meta["c"] == "text" and meta["a"]["b"][1][1] == 3
    assert meta["a"]["b"][0].device.type == "meta" and meta["a"]["b"][1][0].device.type == "meta"
    assert nested["a"]["b"][0].device == cpu   # the original is left as it was
    params = on_device(state["params"], torch.device("meta"))
    assert [p.shape for p in params] == [p.shape for p in state["params"]]
    if torch.cuda.is_available():
        gpu, gpu_model = keeper()
        gpu_model.cuda()
        gpu.params[:] = list(gpu_model.parameters())
        gpu.optimizer.param_groups[0]["params"] = gpu.params
        assert gpu.full_state()["params"][0].device == cpu
        assert keeper()[0].digest() == gpu.digest()
        gpu.load(torch.load(io.BytesIO(source.serialized()), weights_only=True))
        assert all(p.device.type == "cuda" for p in gpu_model.parameters())
        assert gpu.digest() == source.digest()
