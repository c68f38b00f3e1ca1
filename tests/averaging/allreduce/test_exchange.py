"""The post-round exchange (``ar.have``): members tell each other which parts
they completed, so that a part's reducer that answered some members and not
others leaves the same outcome everywhere: dropped where the reducer is gone,
disputed (and reported) where it is alive.  In-memory nodes, virtual time."""

from __future__ import annotations

import pytest
import torch
import trio

from p2pdl.averaging import ALLREDUCE_PROTOCOL_ID, AllReduceConfig, CodecPolicy
from p2pdl.averaging.allreduce import Layout, default_fractions
from p2pdl.averaging.allreduce._messages import HAVE_MESSAGES, Have, Reject
from p2pdl.averaging.allreduce._service import HAVE_GRACE
from p2pdl.averaging.allreduce._state import exchange_roles, settle_parts
from p2pdl.errors import P2PDLError
from p2pdl.testing import open_memory_nodes, open_memory_swarm

from .test_service import connect_all, inputs, make_group

pytestmark = pytest.mark.timeout(120)

CONFIG = AllReduceConfig(codecs=CodecPolicy(large="none"), chunk_values=1024,
                         sender_timeout=5.0, reducer_timeout=10.0, averaging_timeout=60.0)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


# -- the rules, sans-IO --------------------------------------------------------------

def test_roles_pair_every_member_that_uses_results_once():
    class M:
        def __init__(self, client=False, aux=False):
            self.client_mode, self.auxiliary = client, aux

    class G:
        members = (M(), M(client=True), M(), M(aux=True), M(client=True))

    roles = {i: exchange_roles(G, i) for i in range(5)}
    assert roles[3] == ([], [])                       # auxiliary: no part in it
    assert roles[0] == ([2], [1, 4])                  # clients dial the others
    assert roles[1] == ([0, 2], [])                   # two clients cannot meet
    assert roles[2] == ([], [0, 1, 4])
    dials = {(i, j) for i, (dial, _) in roles.items() for j in dial}
    answers = {(j, i) for i, (_, answer) in roles.items() for j in answer}
    assert dials == answers                           # every stream has both ends


def test_a_lacked_part_is_dropped_only_when_its_reducer_is_gone():
    held = frozenset({0, 1, 2})
    heard = {1: frozenset({0, 1}), 3: frozenset({0, 1, 2})}
    gone = settle_parts(held, heard, frozenset({2}), me=0)
    assert gone.dropped == {2: (1,)} and gone.disputed == {}
    alive = settle_parts(held, heard, frozenset(), me=0)
    assert alive.dropped == {} and alive.disputed == {2: (1,)}
    # a member's own part is never dropped (it is its reducer, and alive)
    own = settle_parts(held, {1: frozenset({0, 1})}, frozenset({2}), me=2)
    assert own.dropped == {} and own.disputed == {2: (1,)}
    # nobody lacks anything: nothing to do
    assert settle_parts(held, {1: held}, frozenset({2}), me=0).dropped == {}


# -- over nodes ------------------------------------------------------------------------

def stall_results_for(node, sender: int, done_to_others: trio.Event | None = None):
    """Make ``node``'s reducer send nothing to ``sender`` (a reducer slow for one
    member), until that member ends its stream; ``done_to_others`` is set once
    it delivered its part to every other sender."""
    service = node.allreduce
    original = service._send_results
    delivered: set[int] = set()

    async def send_results(stream, session, who):
        if who == sender:
            await stream.wait_peer_done()
            return
        await original(stream, session, who)
        delivered.add(who)
        if done_to_others is not None and len(delivered) == len(session.group) - 2:
            done_to_others.set()

    service._send_results = send_results


async def test_a_reducer_that_dies_after_answering_some_leaves_every_survivor_alike(
        autojump_clock):
    """Reducer 2 sends its part to member 0, never to member 1, and dies: member 1
    lacks it, says so, and member 0 drops it too -- both end with their own
    values there (the Optimizer applies no update there), the rest identical."""
    async with open_memory_swarm() as swarm:
        nodes = await swarm.add_nodes(3)
        await connect_all(nodes)
        group = make_group(nodes, tag=b"dies")
        xs = inputs(3)
        answered = trio.Event()
        stall_results_for(nodes[2], 1, answered)
        results = {}

        async def member(i):
            results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=CONFIG)

        async def doomed():
            try:
                await nodes[2].allreduce.all_reduce(group, xs[2], config=CONFIG)
            except BaseException:   # noqa: BLE001 - it is killed mid-call
                pass

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member, 0)
            nursery.start_soon(member, 1)
            nursery.start_soon(doomed)
            await answered.wait()
            swarm.kill(nodes[2])
        assert trio.current_time() - start < CONFIG.sender_timeout
        a, b = results[0], results[1]
        assert [p.completed for p in b.parts] == [True, True, False]
        assert [p.completed for p in a.parts] == [True, True, False]
        assert a.parts[2].lacked_by == (1,) and "dropped" in a.parts[2].error
        assert a.heard == (1,) and b.heard == (0,)
        lo, hi = a.parts[2].start, a.parts[2].end
        fa, fb = flat(a.tensors), flat(b.tensors)
        assert torch.equal(fa[:lo], fb[:lo])
        assert torch.equal(fa[lo:hi], flat(xs[0])[lo:hi])   # its own values again
        stats = nodes[0].allreduce.statistics()
        assert stats["parts_dropped"] == 1 and stats["haves_heard"] == 1


async def test_a_reducer_alive_but_silent_to_one_member_leaves_its_part_disputed(
        autojump_clock):
    """Reducer 2 never answers member 1, which gives up after reducer_timeout:
    the reducer is alive, so member 0 and the reducer keep the part and report
    it disputed (the training layer then compares states), and nobody waits
    past reducer_timeout + HAVE_GRACE for anyone."""
    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, tag=b"silent")
        xs = inputs(3)
        stall_results_for(nodes[2], 1)
        results = {}

        async def member(i):
            results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=CONFIG)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(member, i)
        assert trio.current_time() - start < 2 * CONFIG.reducer_timeout + 3
        assert [p.completed for p in results[1].parts] == [True, True, False]
        for i in (0, 2):
            assert results[i].completed
            assert results[i].disputed == (2,)
            assert results[i].parts[2].lacked_by == (1,)
        assert results[1].disputed == ()
        assert torch.equal(flat(results[0].tensors), flat(results[2].tensors))
        assert nodes[0].allreduce.statistics()["parts_disputed"] == 1


async def test_every_member_hears_every_other_in_a_clean_round(autojump_clock):
    async with open_memory_nodes(4) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, clients={3}, tag=b"clean")
        xs = inputs(4)
        results = {}

        async def member(i):
            results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=CONFIG)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(member, i)
        for i, result in results.items():
            assert result.completed and result.disputed == ()
            assert result.heard == tuple(j for j in range(4) if j != i)


async def test_bad_or_foreign_haves_are_refused_and_late_ones_answered(autojump_clock):
    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, tag=b"haves")
        xs = inputs(3)
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(nodes[i].allreduce.all_reduce, group, xs[i])

        async def have(sender_node, to, message):
            async with sender_node.open_stream(to.peer_id, ALLREDUCE_PROTOCOL_ID) as stream:
                await stream.send_message(message)
                with trio.fail_after(15):
                    item = await stream.receive(HAVE_MESSAGES)
                return None if item is None else item[1]

        gid = group.group_id
        # Late, after the round: answered from what the member remembers.
        reply = await have(nodes[0], nodes[1], Have(gid, 0, [0, 1, 2]))
        assert isinstance(reply, Have) and reply.sender == 1 and reply.parts == [0, 1, 2]
        # Another member's index: refused.
        reply = await have(nodes[0], nodes[2], Have(gid, 1, [0]))
        assert isinstance(reply, Reject) and reply.code == "not_member"
        # The wrong direction: member 2 answers, it does not dial member 0.
        reply = await have(nodes[2], nodes[0], Have(gid, 2, [0]))
        assert isinstance(reply, Reject) and reply.code == "not_exchanging"
        # A part twice, or a part that is no member's: a protocol error, the stream reset.
        before = nodes[1].allreduce.statistics()["protocol_errors"]
        for parts in ([0, 0], [7]):
            with pytest.raises(P2PDLError):   # reset by the member
                await have(nodes[0], nodes[1], Have(gid, 0, parts))
        assert nodes[1].allreduce.statistics()["protocol_errors"] == before + 2
        # And the node still averages with the others.
        group2 = make_group(nodes, tag=b"after")
        results = {}

        async def member(i):
            results[i] = await nodes[i].allreduce.all_reduce(group2, xs[i])

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(member, i)
        assert all(r.completed and len(r.heard) == 2 for r in results.values())


async def test_a_member_that_never_says_what_it_holds_delays_the_others_boundedly(
        autojump_clock):
    """A member that averages but withholds its ar.have holds the others up for
    at most reducer_timeout + HAVE_GRACE, and changes nothing they hold."""
    async with open_memory_nodes(3) as nodes:
        await connect_all(nodes)
        group = make_group(nodes, tag=b"mute")
        xs = inputs(3)
        mute = nodes[2].allreduce

        async def silent(*args):
            await trio.sleep_forever()

        mute._exchange_haves = silent    # it neither dials nor answers
        mute._serve_have = silent
        layout = Layout.for_tensors([x.numel() for x in xs[0]], default_fractions(group),
                                    CONFIG.codecs, CONFIG.chunk_values)
        assert layout.chunks[2]
        results, took = {}, {}

        async def member(i):
            results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=CONFIG)
            took[i] = trio.current_time() - start

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member, 0)
            nursery.start_soon(member, 1)
            with trio.move_on_after(CONFIG.averaging_timeout + 5):
                await mute.all_reduce(group, xs[2], config=CONFIG)
        assert all(r.completed for r in results.values())
        assert CONFIG.reducer_timeout <= max(took.values()) \
            <= CONFIG.reducer_timeout + HAVE_GRACE + 1
        assert results[0].heard == (1,)
        assert torch.equal(flat(results[0].tensors), flat(results[1].tensors))
