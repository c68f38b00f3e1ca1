"""The credits in SQLite: a leaderboard, CSV and JSON exports.

Schema (version SCHEMA_VERSION), one database per monitor, any number of runs:

.. code-block:: sql

    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        -- ('schema', '2')
    CREATE TABLE credits (
        run_id TEXT NOT NULL,        -- the run
        peer_id TEXT NOT NULL,       -- the credited peer (base58)
        epoch INTEGER NOT NULL,      -- the epoch its samples counted at
        samples INTEGER NOT NULL,    -- the credit (Ledger's rules)
        credited_at REAL NOT NULL,   -- when (wall clock, s), first credited
        PRIMARY KEY (run_id, peer_id, epoch)) WITHOUT ROWID;
    CREATE TABLE names (
        run_id TEXT NOT NULL,
        peer_id TEXT NOT NULL,       -- a peer (base58)
        name TEXT NOT NULL,          -- the display name its newest signed report gave
        seen_at REAL NOT NULL,       -- when the monitor saw it (wall clock, s)
        PRIMARY KEY (run_id, peer_id)) WITHOUT ROWID;

(``WITHOUT ROWID``: a row is stored once, in its key's order -- half the
bytes of a table with a separate key index.)  A database of schema 1 (no
``names``) is upgraded in place when opened.

A credit for a (run, peer, epoch) already held keeps the larger count and
its first time: writing the same credits twice changes nothing.  Writes are
one transaction per batch; the database is in WAL mode, so a reader (an
export while the monitor runs) never blocks the writer.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ..errors import ConfigError
from ._ledger import Credit

__all__ = ["CreditStore", "Standing", "SCHEMA_VERSION"]

#: The version of the schema above; a database of another version is refused.
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS credits (
    run_id TEXT NOT NULL,
    peer_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    credited_at REAL NOT NULL,
    PRIMARY KEY (run_id, peer_id, epoch)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS names (
    run_id TEXT NOT NULL,
    peer_id TEXT NOT NULL,
    name TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (run_id, peer_id)) WITHOUT ROWID;
"""


@dataclasses.dataclass(frozen=True)
class Standing:
    """A peer's line of the leaderboard of a run."""

    peer_id: str
    samples: int
    epochs: int
    first_epoch: int
    last_epoch: int
    #: the display name the peer's newest signed report gave (None: none)
    name: str | None = None


class CreditStore:
    """Credits in an SQLite database at ``path`` (``":memory:"`` for none on disk).

    It may be made in one thread and used in another (a sync ``Node``'s
    trio thread), one thread at a time.  Raises ConfigError when the file is
    not such a database (another schema version, or not SQLite)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] == "1":   # schema 1 lacked the names table, created above
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema'",
                                 (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise ConfigError(f"{self.path}: a credit database of schema {row[0]}, "
                                  f"not {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{self.path}: not a credit database ({exc})") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> CreditStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, credits: Iterable[Credit]) -> int:
        """Keep ``credits`` (the larger count wins per run, peer and epoch); how many rows
        were new or grew."""
        rows = [(c.run_id, c.peer_id, int(c.epoch), int(c.samples), float(c.time))
                for c in credits]
        if not rows:
            return 0
        before = self._db.total_changes
        with self._transaction():
            self._db.executemany(
                "INSERT INTO credits VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, peer_id, epoch) DO UPDATE SET samples = excluded.samples "
                "WHERE excluded.samples > credits.samples", rows)
        return self._db.total_changes - before

    def set_names(self, run_id: str, names: Mapping[str, str], now: float) -> int:
        """Keep each peer's display name (peer id -> name, from its signed
        reports); how many changed."""
        rows = [(run_id, peer, name, float(now)) for peer, name in names.items()]
        if not rows:
            return 0
        before = self._db.total_changes
        with self._transaction():
            self._db.executemany(
                "INSERT INTO names VALUES (?, ?, ?, ?) ON CONFLICT (run_id, peer_id) "
                "DO UPDATE SET name = excluded.name, seen_at = excluded.seen_at "
                "WHERE excluded.name != names.name", rows)
        return self._db.total_changes - before

    def names(self, run_id: str) -> dict[str, str]:
        """Peer id -> display name, for the run's peers that gave one."""
        return dict(self._db.execute("SELECT peer_id, name FROM names WHERE run_id = ?",
                                     (run_id,)).fetchall())

    def leaderboard(self, run_id: str, limit: int | None = None) -> list[Standing]:
        """The run's peers by samples credited, most first (ties: by peer id),
        with their display names."""
        query = ("SELECT c.peer_id, SUM(c.samples), COUNT(*), MIN(c.epoch), MAX(c.epoch), n.name "
                 "FROM credits c LEFT JOIN names n "
                 "ON n.run_id = c.run_id AND n.peer_id = c.peer_id "
                 "WHERE c.run_id = ? GROUP BY c.peer_id "
                 "ORDER BY SUM(c.samples) DESC, c.peer_id")
        args: tuple[object, ...] = (run_id,)
        if limit is not None:
            query += " LIMIT ?"
            args += (int(limit),)
        return [Standing(*row) for row in self._db.execute(query, args)]

    def credits(self, run_id: str) -> list[Credit]:
        """Every credit of the run, by epoch then peer."""
        rows = self._db.execute("SELECT run_id, peer_id, epoch, samples, credited_at FROM credits "
                                "WHERE run_id = ? ORDER BY epoch, peer_id", (run_id,))
        return [Credit(*row) for row in rows]

    def runs(self) -> list[str]:
        return [row[0] for row in self._db.execute(
            "SELECT DISTINCT run_id FROM credits ORDER BY run_id")]

    def export_csv(self, run_id: str) -> str:
        """The run's credits as CSV: ``run_id,peer_id,name,epoch,samples,credited_at``
        (``name``: the peer's display name, empty for none)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["run_id", "peer_id", "name", "epoch", "samples", "credited_at"])
        names = self.names(run_id)
        for c in self.credits(run_id):
            writer.writerow([c.run_id, c.peer_id, names.get(c.peer_id, ""), c.epoch, c.samples,
                             f"{c.time:.3f}"])
        return out.getvalue()

    def export_json(self, run_id: str) -> str:
        """The run's leaderboard and credits as JSON."""
        return json.dumps({"run_id": run_id,
                           "leaderboard": [dataclasses.asdict(s)
                                           for s in self.leaderboard(run_id)],
                           "credits": [dataclasses.asdict(c) for c in self.credits(run_id)]},
                          indent=1)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
