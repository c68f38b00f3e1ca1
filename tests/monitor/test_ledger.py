"""The accounting's rules (Ledger) and their store (CreditStore), no network."""

from __future__ import annotations

import json
import sqlite3

import pytest

from p2pdl.errors import ConfigError
from p2pdl.monitor import SCHEMA_VERSION, Credit, CreditStore, Ledger

RUN = "run-x"


def credits_of(credits):
    return {(c.peer_id, c.epoch): c.samples for c in credits}


def ledger_of(target: int, **kwargs) -> Ledger:
    """A ledger whose peers' round tags are their names' bytes."""
    return Ledger(RUN, target, tag=str.encode, **kwargs)


def vouch(voucher: str, epoch: int, *peers: str, outcome: str = "averaged"):
    """``voucher``'s report: its part of ``epoch``'s round took ``peers``' values."""
    return (voucher, epoch, outcome, tuple(sorted(p.encode() for p in peers)))


def test_an_epoch_counts_once_the_run_stepped_two_past_it_with_the_largest_claim():
    ledger = ledger_of(100)
    assert ledger.observe([("a", 0, 10, False), ("b", 0, 5, False)], 0, 1.0) == []
    assert ledger.observe([("a", 0, 40, False), ("b", 0, 3, False)], 0, 2.0) == []
    assert ledger.pending == 2
    vouches = [vouch("a", 0, "a", "b"), vouch("b", 0, "a", "b")]
    assert ledger.observe([("a", 1, 2, False), ("b", 0, 60, False)], 1, 3.0, vouches) == []
    due = ledger.observe([], 2, 4.0)
    assert credits_of(due) == {("a", 0): 40, ("b", 0): 60}   # largest, not summed
    assert all(c.time == 4.0 and c.run_id == RUN for c in due)
    assert ledger.pending == 1                                 # a's epoch 1 waits


def test_only_samples_another_member_took_count():
    ledger = ledger_of(100)
    ledger.observe([("a", 0, 10, False), ("b", 0, 20, False), ("c", 0, 30, False),
                    ("d", 0, 40, False)], 0, 1.0)
    vouches = [vouch("a", 0, "a", "b"),                  # a names itself: no credit for a
               vouch("b", 0, "c", outcome="failed"),     # a failed round vouches for nobody
               vouch("c", 0, "d", outcome="partial"),    # a partial one does
               ("d", None, None, None)]                  # a report that names no round
    ledger.observe([], 1, 2.0, vouches)
    assert credits_of(ledger.observe([], 2, 3.0)) == {("b", 0): 20, ("d", 0): 40}
    assert ledger.unvouched == 2                           # a and c


def test_a_claim_counts_at_most_one_target_batch_and_auxiliaries_nothing():
    ledger = ledger_of(64)
    ledger.observe([("liar", 0, 2**31, False), ("aux", 0, 0, True), ("aux2", 0, 99, True),
                    ("idle", 0, 0, False)], 0, 1.0,
                   [vouch("aux", 0, "liar", "aux2", "idle")])
    assert credits_of(ledger.observe([], 2, 2.0)) == {("liar", 0): 64}


def test_only_epochs_the_ledger_saw_complete_count_and_late_reports_do_not():
    ledger = ledger_of(100)
    # started mid-run: the run is at quorum 6, so epochs from 5 count; a peer
    # lagging at epoch 3 is not credited
    everyone = [vouch("b", e, "a") for e in (3, 5, 6)] + [vouch("a", e, "b") for e in (5, 6)]
    assert ledger.observe([("lag", 3, 50, False), ("a", 5, 10, False)], 6, 1.0,
                          everyone) == []
    assert ledger.late == 1
    assert credits_of(ledger.observe([("a", 6, 1, False)], 7, 2.0, everyone)) == {("a", 5): 10}
    ledger.observe([("b", 5, 70, False)], 7, 3.0, everyone)      # epoch 5 already counted
    assert ledger.late == 2 and ledger.pending == 1


def test_pending_pairs_and_vouches_are_bounded_dropping_the_oldest_epochs():
    ledger = ledger_of(100, max_pending=3)
    ledger.observe([(f"p{i}", 10 + i, 1, False) for i in range(5)], 0, 1.0,
                   [vouch("v", 10 + i, f"p{i}") for i in range(5)])
    assert ledger.pending == 3 and ledger.dropped == 4
    assert sorted(e for _, e in ledger._pending) == [12, 13, 14]
    assert sorted(e for _, e in ledger._vouched) == [12, 13, 14]


def test_the_default_tags_are_the_progress_layer_s():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from p2pdl.monitor._ledger import tag_of
    from p2pdl.progress import round_tag

    peer = ID.from_pubkey(create_new_key_pair(b"\x07" * 32).public_key)
    assert tag_of(peer.to_base58()) == round_tag(peer.to_bytes())
    assert tag_of("not base58 0OIl") == b""


def test_a_bad_target_is_refused():
    with pytest.raises(ValueError):
        Ledger(RUN, 0)


def test_the_store_keeps_the_largest_credit_once_across_restarts(tmp_path):
    path = tmp_path / "credits.sqlite"
    with CreditStore(path) as store:
        assert store.add([Credit(RUN, "a", 0, 40, 1.0), Credit(RUN, "b", 0, 60, 1.0),
                          Credit(RUN, "a", 1, 30, 2.0), Credit("other", "a", 0, 5, 1.0)]) == 4
        assert store.add([Credit(RUN, "a", 0, 40, 9.0)]) == 0      # the same again: nothing
    with CreditStore(path) as store:                                 # a restart
        assert store.add([Credit(RUN, "a", 0, 20, 9.0)]) == 0      # smaller: kept as it was
        assert store.add([Credit(RUN, "a", 0, 45, 9.0)]) == 1      # larger: grows
        board = store.leaderboard(RUN)
        assert [(s.peer_id, s.samples, s.epochs) for s in board] == [("a", 75, 2), ("b", 60, 1)]
        assert store.leaderboard(RUN, limit=1)[0].peer_id == "a"
        assert store.runs() == ["other", RUN]
        first = [c for c in store.credits(RUN) if c.peer_id == "a" and c.epoch == 0][0]
        assert first.time == 1.0 and first.samples == 45               # first credited at 1.0
        assert store.set_names(RUN, {"a": "alice"}, 3.0) == 1
        assert store.set_names(RUN, {"a": "alice"}, 4.0) == 0          # unchanged: no write
        rows = store.export_csv(RUN).splitlines()
        assert rows[0] == "run_id,peer_id,name,epoch,samples,credited_at" and len(rows) == 4
        assert rows[1].startswith(f"{RUN},a,alice,0,45,") and rows[2].startswith(f"{RUN},b,,0,")
        data = json.loads(store.export_json(RUN))
        assert data["leaderboard"][0] == {"peer_id": "a", "samples": 75, "epochs": 2,
                                          "first_epoch": 0, "last_epoch": 1, "name": "alice"}
        assert data["leaderboard"][1]["name"] is None
    with CreditStore(path) as store:                                 # names survive restarts
        assert store.names(RUN) == {"a": "alice"} and store.names("other") == {}
        assert store.set_names(RUN, {"a": "alice2"}, 5.0) == 1
        assert store.leaderboard(RUN)[0].name == "alice2"
        assert len(data["credits"]) == 3


def test_a_schema_1_database_is_upgraded_in_place(tmp_path):
    path = tmp_path / "v1.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1');
        CREATE TABLE credits (run_id TEXT NOT NULL, peer_id TEXT NOT NULL,
            epoch INTEGER NOT NULL, samples INTEGER NOT NULL, credited_at REAL NOT NULL,
            PRIMARY KEY (run_id, peer_id, epoch));
        INSERT INTO credits VALUES ('run-x', 'a', 0, 10, 1.0);""")
    db.commit()
    db.close()
    with CreditStore(path) as store:
        assert [(s.peer_id, s.samples, s.name) for s in store.leaderboard(RUN)] == [("a", 10, None)]
        store.set_names(RUN, {"a": "alice"}, 2.0)
    db = sqlite3.connect(path)
    schema = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    assert schema == (str(SCHEMA_VERSION),)
    db.close()


def test_a_file_that_is_not_a_credit_database_is_one_clear_error(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(ConfigError, match="not a credit database"):
        CreditStore(junk)
    other = tmp_path / "other.sqlite"
    CreditStore(other).close()
    db = sqlite3.connect(other)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match=f"schema 99, not {SCHEMA_VERSION}"):
        CreditStore(other)
