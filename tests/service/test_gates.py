"""The node's gate, composed: a user's gate and the memberships, then the bans."""

from __future__ import annotations

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.service import BanningGate, BothGates, FlagBook, OpenAdmission, Refusal, Role


def peer() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


class Members(OpenAdmission):
    """Memberships that know one member, and learn one credential."""

    def __init__(self, member: ID) -> None:
        self.members = {member}

    def admit(self, peer, protocol_id, run_id):
        return None if run_id is None or peer in self.members else Refusal("no member")

    def is_member(self, peer, run_id):
        return peer in self.members

    def role_of(self, peer, run_id):
        return Role.TRAINER if peer in self.members else None

    def learn(self, peer, run_id, credential):
        if credential == b"ok":
            self.members.add(peer)
        return peer in self.members


class AdmitOnly:
    """A user's gate with nothing but ``admit``."""

    def __init__(self, refused: ID) -> None:
        self.refused = refused

    def admit(self, peer, protocol_id, run_id):
        return Refusal("not here") if peer == self.refused else None


def test_a_banned_peer_is_refused_no_member_and_learns_nothing():
    member, other = peer(), peer()
    flags = FlagBook()
    gate = BanningGate(Members(member), flags, clock=lambda: 100.0)
    assert gate.admit(member, "/p", "run") is None and gate.is_member(member, "run")
    assert gate.role_of(member, "run") is Role.TRAINER
    for _ in range(5):
        flags.flag(member, "run", "equivocation", 100.0)
    assert flags.is_banned(member, "run", 100.0)
    assert "banned" in gate.admit(member, "/p", "run").reason
    assert not gate.is_member(member, "run")
    flags.flag(other, "run", "equivocation", 100.0)
    assert flags.is_banned(other, "run", 100.0)
    # a credential gossiped for a banned peer makes it no member of the run
    assert not gate.learn(other, "run", b"ok")
    assert gate.admit(member, "/p", "elsewhere") is None   # a ban is of one run


def test_both_gates_need_both_and_a_user_gate_may_only_admit():
    member, refused = peer(), peer()
    both = BothGates(AdmitOnly(refused), Members(member))
    assert both.admit(member, "/p", "run") is None
    assert both.admit(refused, "/p", None).reason == "not here"   # the user's gate
    assert both.admit(peer(), "/p", "run").reason == "no member"   # the memberships
    assert both.is_member(member, "run") and both.role_of(member, "run") is Role.TRAINER
    assert both.credential("run") is None
    newcomer = peer()
    assert both.learn(newcomer, "run", b"ok") and both.is_member(newcomer, "run")


def test_the_book_names_a_runs_latest_bans_and_whom_it_suspects():
    """What a matchmaking joiner refuses (its latest bans, bounded) and what
    lets a leader leave a refused member out (a ban, or a strike in the run)."""
    a, b, c, d = peer(), peer(), peer(), peer()
    flags = FlagBook(ban_seconds=10.0)
    flags.ban(a, "run", 0.0, "test")
    flags.ban(b, "run", 1.0, "test")
    flags.ban(c, "other", 1.0, "test")
    assert flags.banned_peers("run", 2.0, 16) == [b.to_bytes(), a.to_bytes()]
    assert flags.banned_peers("run", 2.0, 1) == [b.to_bytes()]
    assert flags.banned_peers("run", 10.5, 16) == [b.to_bytes()]   # a's ban ended
    assert flags.suspects(a, "run", 2.0) and not flags.suspects(c, "run", 2.0)
    flags.flag(d, "run", "epoch_ahead", 2.0)      # a kind that never bans: no evidence
    assert not flags.suspects(d, "run", 2.0)
    flags.flag(d, "run", "outlier_values", 2.0)   # one strike of three
    assert flags.suspects(d, "run", 2.0) and not flags.suspects(d, "other", 2.0)
    assert not flags.is_banned(d, "run", 2.0)
