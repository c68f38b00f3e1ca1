"""Certificates, revocation lists, the authority and its files; the policies and
the membership table.  No network."""

from __future__ import annotations

import dataclasses
import os
import stat

import msgpack
import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl import (
    AllowlistRun,
    Authority,
    Certificate,
    CertificateRun,
    ConfigError,
    OpenRun,
    RemoteProtocolError,
    RevocationList,
    Role,
)
from p2pdl.membership import MembershipConfig, MembershipTable
from p2pdl.membership.config import MAX_CERTIFICATE_SIZE, MAX_REVOCATION_LIST_SIZE
from p2pdl.service import NOT_ADMITTED

RUN = "cert-run"
NOW = 1_700_000_000.0
SKEW = 30.0


def peer() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.generate()


def test_a_certificate_verifies_and_round_trips(authority):
    member = peer()
    cert = authority.issue(RUN, member, Role.AUXILIARY, expires_in=3600, now=NOW, serial=7)
    assert (cert.run_id, cert.peer_id, cert.role, cert.serial) == \
        (RUN, member.to_base58(), Role.AUXILIARY, 7)
    assert cert.authority == authority.id and authority.id.startswith("12D3KooW")
    assert cert.expires_at == NOW + 3600
    assert cert.problem(authority.id, RUN, member, NOW + 10, SKEW) is None
    assert cert.problem(authority.id, RUN, member.to_base58(), NOW, SKEW) is None
    assert Certificate.from_bytes(cert.to_bytes()) == cert
    assert len(cert.to_bytes()) < MAX_CERTIFICATE_SIZE
    default = authority.issue(RUN, member, "trainer", now=NOW)
    assert default.expires_at == NOW + 30 * 86400 and default.role is Role.TRAINER


def test_forged_and_misused_certificates_are_refused(authority):
    member, other = peer(), peer()
    cert = authority.issue(RUN, member, Role.MONITOR, expires_in=3600, now=NOW)
    impostor = Authority.generate()
    assert cert.problem(impostor.id, RUN, member, NOW, SKEW) == "signed by another authority"
    assert cert.problem(authority.id, "other-run", member, NOW, SKEW) == "for another run"
    assert cert.problem(authority.id, RUN, other, NOW, SKEW) == "for another peer"
    # Every edited field breaks the signature.
    for field, value in (("role", Role.TRAINER), ("expires_at", NOW + 10**6),
                         ("issued_at", NOW - 1), ("serial", cert.serial + 1),
                         ("peer_id", other.to_base58()), ("run_id", "x")):
        edited = dataclasses.replace(cert, **{field: value})
        subject = other if field == "peer_id" else member
        run = "x" if field == "run_id" else RUN
        assert edited.problem(authority.id, run, subject, NOW, SKEW) == "bad signature", field
    # A certificate re-signed by another key names that key: not the run's authority.
    forged = impostor.issue(RUN, member, Role.TRAINER, now=NOW)
    assert forged.problem(authority.id, RUN, member, NOW, SKEW) == "signed by another authority"
    relabelled = dataclasses.replace(forged, authority=authority.id)
    assert relabelled.problem(authority.id, RUN, member, NOW, SKEW) == "bad signature"
    assert dataclasses.replace(cert, signature=b"\x00" * 64).problem(
        authority.id, RUN, member, NOW, SKEW) == "bad signature"
    assert dataclasses.replace(cert, signature=b"").problem(
        authority.id, RUN, member, NOW, SKEW) == "bad signature"


def test_validity_window_with_clock_skew(authority):
    member = peer()
    cert = authority.issue(RUN, member, Role.TRAINER, expires_at=NOW + 100, now=NOW)
    assert cert.problem(authority.id, RUN, member, NOW - SKEW + 1, SKEW) is None
    assert cert.problem(authority.id, RUN, member, NOW - SKEW - 1, SKEW) == "not valid yet"
    assert cert.problem(authority.id, RUN, member, NOW + 100 + SKEW - 1, SKEW) is None
    assert cert.problem(authority.id, RUN, member, NOW + 100 + SKEW, SKEW) == "expired"
    assert cert.problem(authority.id, RUN, member, NOW + 100, 0) == "expired"


@pytest.mark.parametrize("junk", [
    b"", b"\xc1", b"\x00" * 10, msgpack.packb({"a": 1}), msgpack.packb([1, 2, 3]),
    msgpack.packb([1, "r", "p", "trainer", 1.0, 2.0, 1, "a"]),           # 8 fields
    msgpack.packb([2, "r", "p", "trainer", 1.0, 2.0, 1, "a", b"s"]),     # format 2
    msgpack.packb([1, "", "p", "trainer", 1.0, 2.0, 1, "a", b"s"]),      # empty run
    msgpack.packb([1, "r", "p", "admin", 1.0, 2.0, 1, "a", b"s"]),       # no such role
    msgpack.packb([1, "r", "p", "trainer", 1, 2.0, 1, "a", b"s"]),       # int time
    msgpack.packb([1, "r", "p", "trainer", float("nan"), 2.0, 1, "a", b"s"]),
    msgpack.packb([1, "r", "p", "trainer", 1.0, 2.0, -1, "a", b"s"]),    # negative serial
    msgpack.packb([1, "r", "p", "trainer", 1.0, 2.0, 2**64 - 1, "a", b"s"]),
    msgpack.packb([1, "r", "p", "trainer", 1.0, 2.0, True, "a", b"s"]),  # bool serial
    msgpack.packb([1, "r", b"p", "trainer", 1.0, 2.0, 1, "a", b"s"]),    # bytes peer id
    msgpack.packb([1, "r", "p", "trainer", 1.0, 2.0, 1, "a", "s"]),      # str signature
    msgpack.packb([1, "r", "p" * 200, "trainer", 1.0, 2.0, 1, "a", b"s"]),
    msgpack.packb([1, "r", "p", "trainer", 1.0, 2.0, 1, "a", b"s" * 200]),
    b"\x99" + b"\x00" * (MAX_CERTIFICATE_SIZE + 1),                     # oversized
])
def test_junk_is_a_remote_protocol_error(junk):
    with pytest.raises(RemoteProtocolError):
        Certificate.from_bytes(junk)
    with pytest.raises(RemoteProtocolError):
        RevocationList.from_bytes(junk)


def test_wrong_types_are_remote_protocol_errors():
    for value in (None, "text", 12, [b"x"]):
        with pytest.raises(RemoteProtocolError):
            Certificate.from_bytes(value)  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError):
        RevocationList.from_bytes(b"\x00" * (MAX_REVOCATION_LIST_SIZE + 1))
    unsorted = msgpack.packb([1, "r", "a", 1, 1.0, [3, 2], b"s"])
    with pytest.raises(RemoteProtocolError):
        RevocationList.from_bytes(unsorted)


def test_revocation_lists(authority):
    rl = authority.revocation_list(RUN, [5, 3, 3], sequence=2, now=NOW)
    assert rl.serials == frozenset({3, 5}) and rl.sequence == 2
    assert RevocationList.from_bytes(rl.to_bytes()) == rl
    assert rl.problem(authority.id, RUN, NOW, SKEW) is None
    assert rl.problem(Authority.generate().id, RUN, NOW, SKEW) == "signed by another authority"
    assert rl.problem(authority.id, "other", NOW, SKEW) == "for another run"
    assert dataclasses.replace(rl, serials=frozenset({3})).problem(
        authority.id, RUN, NOW, SKEW) == "bad signature"
    assert dataclasses.replace(rl, sequence=3).problem(authority.id, RUN, NOW, SKEW) \
        == "bad signature"
    assert rl.problem(authority.id, RUN, NOW - 2 * SKEW, SKEW) == "issued in the future"
    big = authority.revocation_list(RUN, range(2**62, 2**62 + 4096), sequence=1, now=NOW)
    assert len(big.to_bytes()) <= MAX_REVOCATION_LIST_SIZE
    with pytest.raises(ConfigError):
        authority.revocation_list(RUN, range(4097), sequence=1)
    with pytest.raises(ConfigError):
        authority.revocation_list(RUN, [1], sequence=-1)


def test_files_round_trip_and_the_key_is_private(tmp_path, authority):
    key_path = authority.save(tmp_path / "auth")
    assert key_path == tmp_path / "auth" / "authority.key"
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    assert (tmp_path / "auth" / "authority.id").read_text().strip() == authority.id
    assert Authority.load(key_path).id == authority.id
    assert Authority.load(tmp_path / "auth").id == authority.id
    with pytest.raises(ConfigError):
        authority.save(tmp_path / "auth")  # never overwrites a key
    assert Authority.load(key_path).id == authority.id
    member = peer()
    cert = authority.issue(RUN, member, Role.TRAINER, now=NOW)
    cert_path = cert.save(tmp_path / "member.cert")
    text = cert_path.read_text()
    assert text.startswith("p2pdl membership certificate v1\n") and text.isascii()
    assert Certificate.load(cert_path) == cert
    rl = authority.revocation_list(RUN, [1, 2], sequence=4, now=NOW)
    assert RevocationList.load(rl.save(tmp_path / "revoked.txt")) == rl
    (tmp_path / "bad").write_text("p2pdl membership certificate v1\n!!!\n")
    with pytest.raises(ConfigError):
        Certificate.load(tmp_path / "bad")
    with pytest.raises(ConfigError):
        Certificate.load(tmp_path / "revoked.txt")  # another kind of file
    with pytest.raises(ConfigError):
        Certificate.load(tmp_path / "missing")


def test_allowlist_files(tmp_path):
    a, b = peer(), peer()
    path = tmp_path / "allow.txt"
    path.write_text(f"# volunteers\n{a.to_base58()}  # alice\n\n  {b.to_base58()}\n")
    policy = AllowlistRun.load(RUN, path)
    assert policy.peers == {a.to_base58(), b.to_base58()}
    path.write_text("not-a-peer-id\n")
    with pytest.raises(ConfigError, match=":1:"):
        AllowlistRun.load(RUN, path)
    with pytest.raises(ConfigError):
        AllowlistRun(RUN, ["12D3KooWnope"])
    with pytest.raises(ConfigError):
        OpenRun("")


def test_a_certificate_run_checks_its_own_certificate(tmp_path, authority):
    me = peer()
    cert = authority.issue(RUN, me, Role.TRAINER, now=NOW)
    policy = CertificateRun(RUN, authority.id, cert.save(tmp_path / "c"))
    assert policy.certificate == cert and CertificateRun(RUN, authority).authority == authority.id
    with pytest.raises(ConfigError):
        CertificateRun("other", authority.id, cert)
    with pytest.raises(ConfigError):
        CertificateRun(RUN, Authority.generate().id, cert)
    table = MembershipTable(peer(), MembershipConfig())
    with pytest.raises(ConfigError, match="not this node"):
        table.add_run(policy, NOW)


def test_the_table_is_the_gate(authority):
    me, member, monitor, stranger = peer(), peer(), peer(), peer()
    table = MembershipTable(me, MembershipConfig(allowed_clock_skew=SKEW, max_members=2),
                            averaging_protocols={"/avg"})
    table.add_run(CertificateRun(RUN, authority.id,
                                 authority.issue(RUN, me, Role.TRAINER, now=NOW)), NOW)
    table.add_run(AllowlistRun("listed", [member]), NOW)
    table.add_run(OpenRun("open"), NOW)
    # Unknown runs and open runs admit everyone; runs are gated per run.
    assert table.admit(stranger, "/p", "unguarded", NOW) is None
    assert table.admit(stranger, "/p", "open", NOW) is None
    assert table.admit(stranger, "/p", None, NOW) is None
    assert table.admit(member, "/p", "listed", NOW) is None
    assert table.admit(stranger, "/p", "listed", NOW).code == NOT_ADMITTED
    refusal = table.admit(stranger, "/p", RUN, NOW)
    assert refusal.code == NOT_ADMITTED and RUN not in refusal.reason
    cert = authority.issue(RUN, member, Role.TRAINER, expires_at=NOW + 100, now=NOW, serial=11)
    assert table.offer_certificate(stranger, RUN, cert, NOW) == "for another peer"
    assert table.offer_certificate(member, RUN, cert.to_bytes(), NOW) is None
    assert table.admit(member, "/avg", RUN, NOW) is None
    assert table.role_of(member, RUN, NOW) is Role.TRAINER and table.role_of(member, "listed",
                                                                               NOW) is None
    table.offer_certificate(monitor, RUN, authority.issue(RUN, monitor, "monitor", now=NOW), NOW)
    assert table.admit(monitor, "/p", RUN, NOW) is None
    assert table.admit(monitor, "/avg", RUN, NOW).code == NOT_ADMITTED
    assert set(table.members(RUN, NOW)) == {me.to_base58(), member.to_base58(),
                                            monitor.to_base58()}
    # Expiry is re-checked on every question, without a new handshake.
    assert table.is_member(member, RUN, NOW + 100 + SKEW - 1)
    assert not table.is_member(member, RUN, NOW + 100 + SKEW)
    # Revocation: a newer valid list is obeyed; an older or forged one is not.
    assert table.offer_revocations(authority.revocation_list(RUN, [11], sequence=1, now=NOW),
                                   NOW) is None
    assert not table.is_member(member, RUN, NOW)
    assert table.offer_certificate(member, RUN, cert, NOW) == "revoked"
    assert table.offer_revocations(authority.revocation_list(RUN, [], sequence=1, now=NOW),
                                   NOW) == "not newer"
    forged = Authority.generate().revocation_list(RUN, [], sequence=9, now=NOW)
    assert table.offer_revocations(forged, NOW) == "signed by another authority"
    assert table.revocation_sequence(RUN) == 1
    # The table is bounded: the least recently admitted member is forgotten.
    others = [peer() for _ in range(3)]
    for other in others:
        assert table.offer_certificate(other, RUN, authority.issue(RUN, other, "trainer",
                                                                   now=NOW), NOW) is None
    assert table.member_count() == 2
    assert not table.is_member(others[0], RUN, NOW) and table.is_member(others[2], RUN, NOW)
    assert table.credential(RUN) is not None and table.credential("listed") is None
