"""What a report says of its peer for people: a display name, the recent
loss, the path.  Signed with the report, bounded, checked, never counted."""

from __future__ import annotations

import dataclasses
import math

import msgpack
import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from p2pdl.progress import (
    PATH_KINDS,
    ProgressConfig,
    Report,
    ReportInfo,
    check_info,
    round_tag,
    round_tags,
    sign_report,
    verify_report,
)
from p2pdl.progress._messages import Push
from p2pdl.progress._state import check_report_values, to_peer_report
from p2pdl.progress.config import MAX_ROUND_CONTRIBUTORS
from p2pdl.testing import MemoryNetwork, open_memory_nodes, wait_for_dht, wait_until
from p2pdl.wire import encode_message

pytestmark = pytest.mark.timeout(60)

RUN = "info-run"


def signed(info: ReportInfo | None, **fields) -> Report:
    pair = create_new_key_pair()
    values = dict(epoch=3, samples_accumulated=640, samples_per_second=12.5,
                  time=1_700_000_000.25, client_mode=False)
    values.update(fields)
    return sign_report(pair.private_key, ID.from_pubkey(pair.public_key), RUN, info=info,
                       **values)


def test_the_info_is_signed_with_the_report():
    info = ReportInfo("alice's laptop", 2.25, "hole-punched", 2, "averaged", 4)
    report = signed(info)
    assert verify_report(report) is not None
    assert verify_report(dataclasses.replace(report, info=None)) is None          # stripped
    for forged in (ReportInfo("mallory", 2.25, "hole-punched", 2, "averaged", 4),
                   ReportInfo("alice's laptop", 0.5, "hole-punched", 2, "averaged", 4),
                   ReportInfo("alice's laptop", 2.25, "direct", 2, "averaged", 4),
                   ReportInfo("alice's laptop", 2.25, None, 2, "averaged", 4),
                   ReportInfo("alice's laptop", 2.25, "hole-punched", 1, "averaged", 4),
                   ReportInfo("alice's laptop", 2.25, "hole-punched", 2, "failed", 4),
                   ReportInfo("alice's laptop", 2.25, "hole-punched", 2, "averaged", 8)):
        assert verify_report(dataclasses.replace(report, info=forged)) is None, forged
    plain = signed(None)
    assert verify_report(plain) is not None
    assert verify_report(dataclasses.replace(plain, info=ReportInfo(name="x"))) is None  # added


def test_a_report_without_info_signs_as_before():
    # The payload of a report with no info is the first revision's, byte for byte.
    from p2pdl.progress._messages import SIGNATURE_DOMAIN, signing_payload

    payload = signing_payload(RUN, b"\x00\x24", 3, 640, 12.5, 1.0, False, False)
    assert payload == signing_payload(RUN, b"\x00\x24", 3, 640, 12.5, 1.0, False, False, None)
    assert SIGNATURE_DOMAIN.encode() in payload
    assert payload != signing_payload(RUN, b"\x00\x24", 3, 640, 12.5, 1.0, False, False,
                                      ReportInfo())


def test_the_view_keeps_the_info():
    report = signed(ReportInfo("bob", 1.5, "relayed"))
    kept = to_peer_report(report)
    assert (kept.name, kept.loss, kept.path) == ("bob", 1.5, "relayed")
    assert check_report_values(kept, report.time, ProgressConfig()) is None
    bare = to_peer_report(signed(None))
    assert (bare.name, bare.loss, bare.path) == (None, None, None)


@pytest.mark.parametrize("name, loss, path", [
    ("", None, None), ("   ", None, None), ("a\x1b[2Jb", None, None), ("line\nbreak", None, None),
    ("x" * 65, None, None), (None, math.nan, None), (None, math.inf, None),
    (None, None, "teleported")])
def test_an_absurd_info_is_dropped(name, loss, path):
    assert check_info(name, loss, path) is not None
    kept = dataclasses.replace(to_peer_report(signed(None)), name=name, loss=loss, path=path)
    assert check_report_values(kept, kept.time, ProgressConfig()) is not None


def test_a_round_ahead_of_the_report_or_of_no_known_outcome_is_dropped():
    config = ProgressConfig()
    base = to_peer_report(signed(None))                  # epoch 3
    ok = dataclasses.replace(base, round_epoch=3, round_outcome="partial", round_group=5)
    assert check_report_values(ok, ok.time, config) is None
    for bad in (dataclasses.replace(ok, round_epoch=4),
                dataclasses.replace(ok, round_outcome="won")):
        assert check_report_values(bad, bad.time, config) is not None


def test_a_round_names_its_contributors_by_tags_signed_bounded_and_sorted():
    tags = tuple(sorted(round_tag(bytes([i]) * 34) for i in range(3)))
    info = ReportInfo("dave", None, None, 2, "averaged", 4, tags)
    report = signed(info)
    assert verify_report(report) is not None
    for forged in (dataclasses.replace(info, round_contributors=tags[:2]),    # one struck out
                   dataclasses.replace(info, round_contributors=None),        # all struck out
                   dataclasses.replace(info, round_contributors=tags + (b"\x00" * 8,))):
        assert verify_report(dataclasses.replace(report, info=forged)) is None, forged
    kept = to_peer_report(report)
    assert kept.round_contributors == tags
    config = ProgressConfig()
    assert check_report_values(kept, kept.time, config) is None
    for bad in (tags[::-1], tags + tags[-1:], (b"\x01" * 7,),):
        wrong = dataclasses.replace(kept, round_contributors=bad)
        assert check_report_values(wrong, wrong.time, config) is not None, bad
    unnamed = dataclasses.replace(kept, round_epoch=None, round_outcome=None, round_group=None)
    assert check_report_values(unnamed, unnamed.time, config) is not None
    # the wire holds at most MAX_ROUND_CONTRIBUTORS tags of ROUND_TAG_SIZE bytes
    push = Push(RUN, (report,))
    for value in ([b"\x00" * 9], [bytes([i]) * 8 for i in range(MAX_ROUND_CONTRIBUTORS + 1)]):
        wire = msgpack.unpackb(encode_message(push), raw=False)[2]
        wire["reports"][0]["info"]["round_contributors"] = value
        with pytest.raises(RemoteProtocolError):
            Push.from_wire(wire)


def test_a_large_group_is_named_in_a_window_after_the_reporter():
    members = [bytes([i, i]) * 17 for i in range(3 * MAX_ROUND_CONTRIBUTORS)]
    named = {}
    for reporter in members:
        tags = round_tags(reporter, members)
        assert len(tags) == MAX_ROUND_CONTRIBUTORS and list(tags) == sorted(tags)
        assert round_tag(reporter) not in tags
        for tag in tags:
            named[tag] = named.get(tag, 0) + 1
    # every member is named by about as many reducers as any other
    assert set(named) == {round_tag(m) for m in members}
    assert min(named.values()) == max(named.values()) == MAX_ROUND_CONTRIBUTORS
    assert round_tags(members[0], members[:3]) == tuple(sorted(round_tag(m)
                                                               for m in members[1:3]))


def test_every_path_kind_and_a_long_unicode_name_pass():
    for kind in PATH_KINDS:
        assert check_info(None, None, kind) is None
    assert check_info("Ωmega 東京 " + "x" * 54, -0.0, None) is None


def test_the_wire_bounds_the_info():
    report = signed(ReportInfo("carol", 3.0, "direct"))
    push = Push(RUN, (report,))

    def body():   # the push as a receiver's decoder sees it
        return msgpack.unpackb(encode_message(push), raw=False)[2]

    assert Push.from_wire(body()) == push
    for field, value in (("name", "x" * 65), ("path", "teleported"), ("loss", "high"),
                         ("loss", math.nan)):
        wire = body()
        wire["reports"][0]["info"][field] = value
        with pytest.raises(RemoteProtocolError):
            Push.from_wire(wire)


async def test_a_tracker_reports_its_name_loss_and_path():
    async with open_memory_nodes(2, network=MemoryNetwork(latency=0.005)) as nodes:
        await wait_for_dht(nodes)
        async with nodes[0].progress.track(RUN, 1000, name="alice") as alice, \
                nodes[1].progress.track(RUN, 1000) as bob:
            alice.report(10, loss=2.5, last_round=(0, "averaged", 2, (nodes[1].peer_id,)))
            alice.publish_now()
            me = nodes[0].peer_id.to_bytes()

            def seen():
                return next((r for r in bob.peers() if r.peer_id == me), None)

            await wait_until(lambda: seen() is not None and seen().loss == 2.5, 30, step=0.05)
            report = seen()
            assert (report.name, report.loss, report.path) == ("alice", 2.5, "direct")
            assert (report.round_epoch, report.round_outcome, report.round_group) == \
                (0, "averaged", 2)
            assert report.round_contributors == (round_tag(nodes[1].peer_id.to_bytes()),)
            assert alice.loss == 2.5 and alice.name == "alice"
            # bob said nothing of itself: alice sees no name and no loss.
            await wait_until(lambda: any(r.peer_id != me for r in alice.peers()), 30,
                             step=0.05)
            theirs = next(r for r in alice.peers() if r.peer_id != me)
            assert (theirs.name, theirs.loss) == (None, None)
            with pytest.raises(LocalProtocolError):
                alice.report(20, loss=math.nan)
            for bad in ((0, "won", 1), (0, "averaged", -1), [0, "averaged", 2], (0, "x"),
                        (0, "averaged", 2, ("not base58!",)), (0, "averaged", 2, 7)):
                with pytest.raises(LocalProtocolError, match="last_round"):
                    alice.report(20, last_round=bad)
        with pytest.raises(ConfigError):
            async with nodes[0].progress.track(RUN, 1000, name="bad\x07name"):
                pass

