"""``p2pdl identity``, ``p2pdl auth`` and the membership flags of ``train`` and ``node``.

Most run ``p2pdl.cli.main`` in this process (the flags are checked before
any node starts); one runs the real command to see that a mistake is one
line on stderr without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2pdl.cli import main
from p2pdl.cli._args import duration
from p2pdl.membership import Authority, Certificate, RevocationList
from p2pdl.service import Role

pytestmark = pytest.mark.timeout(60)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``p2pdl ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, message: str) -> None:
    """A user's mistake: status 2, the message on the last line of stderr, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error:" in last and message in last, err


@pytest.fixture
def operator(tmp_path, capsys):
    """An authority, a member's identity and its certificate for run ``r1``."""
    code, out, _ = run(capsys, "auth", "init", "--out", str(tmp_path / "auth"))
    assert code == 0
    authority_id = (tmp_path / "auth" / "authority.id").read_text().strip()
    code, peer_id, _ = run(capsys, "identity", "--identity", str(tmp_path / "id.key"))
    peer_id = peer_id.strip()
    code, _, _ = run(capsys, "auth", "issue", "--authority", str(tmp_path / "auth/authority.key"),
                     "--run-id", "r1", "--peer-id", peer_id, "--role", "trainer",
                     "--expires", "7d", "--serial", "5", "--out", str(tmp_path / "c.cert"))
    assert code == 0
    return argparse.Namespace(dir=tmp_path, authority_id=authority_id, peer_id=peer_id,
                              key=str(tmp_path / "auth/authority.key"),
                              identity=str(tmp_path / "id.key"),
                              cert=str(tmp_path / "c.cert"))


# -- identity ------------------------------------------------------------------------

def test_identity_creates_the_key_and_prints_the_same_id_twice(tmp_path, capsys):
    path = tmp_path / "sub" / "id.key"
    code, first, _ = run(capsys, "identity", "--identity", str(path))
    assert code == 0 and first.strip().startswith("12D3KooW") and len(first.splitlines()) == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    code, second, _ = run(capsys, "identity", "--identity", str(path))
    assert second == first
    code, js, _ = run(capsys, "identity", "--identity", str(path), "--json")
    assert f'"peer_id": "{first.strip()}"' in js


def test_identity_default_file_is_the_one_closed_runs_use(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    code, out, _ = run(capsys, "identity")
    assert code == 0
    assert (tmp_path / ".p2pdl" / "identity.key").exists()
    from p2pdl.cli._runs import identity_path

    closed = argparse.Namespace(identity=None, authority="x", certificate="c", allowlist=None,
                                revocations=None)
    assert identity_path(closed) == str(tmp_path / ".p2pdl" / "identity.key")
    opened = argparse.Namespace(identity=None, authority=None, certificate=None,
                                allowlist=None, revocations=None)
    assert identity_path(opened) is None  # an open run: a new identity every run


def test_identity_of_a_corrupt_file_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.key").write_bytes(b"not a key")
    code, _, err = run(capsys, "identity", "--identity", str(tmp_path / "bad.key"))
    one_line_error(code, err, "corrupt")
    assert (tmp_path / "bad.key").read_bytes() == b"not a key"


# -- auth init -----------------------------------------------------------------------

def test_init_makes_a_private_key_and_refuses_to_overwrite_it(tmp_path, capsys):
    code, out, _ = run(capsys, "auth", "init", "--out", str(tmp_path / "a"))
    assert code == 0
    key = tmp_path / "a" / "authority.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    authority_id = (tmp_path / "a" / "authority.id").read_text().strip()
    assert f"authority id: {authority_id}" in out
    assert Authority.load(key).id == authority_id
    before = key.read_bytes()
    code, _, err = run(capsys, "auth", "init", "--out", str(tmp_path / "a"))
    one_line_error(code, err, "never overwritten")
    assert key.read_bytes() == before


# -- auth issue / show / revoke --------------------------------------------------------

def test_issue_writes_a_certificate_that_show_verifies(operator, capsys):
    certificate = Certificate.load(operator.cert)
    assert (certificate.run_id, certificate.peer_id, certificate.role, certificate.serial) == \
        ("r1", operator.peer_id, Role.TRAINER, 5)
    assert certificate.authority == operator.authority_id
    assert certificate.expires_at - certificate.issued_at == pytest.approx(7 * 86400)
    assert certificate.problem(operator.authority_id, "r1", operator.peer_id,
                               time.time()) is None
    code, out, _ = run(capsys, "auth", "show", operator.cert)
    assert code == 0
    assert "run:        r1" in out and "serial:     5" in out and "role:       trainer" in out
    assert f"verifies under authority {operator.authority_id}" in out
    code, out, _ = run(capsys, "auth", "show", operator.cert, "--authority", operator.peer_id)
    assert code == 1 and "does NOT verify" in out


def test_issue_prints_the_summary(operator, capsys):
    code, out, _ = run(capsys, "auth", "issue", "--authority", operator.key, "--run-id", "r2",
                       "--peer-id", operator.peer_id, "--role", "monitor", "--expires", "12h",
                       "--out", str(operator.dir / "m.cert"))
    assert code == 0
    for text in ("run:        r2", f"peer:       {operator.peer_id}", "role:       monitor",
                 "expires:", "UTC", "serial:"):
        assert text in out


def test_a_tampered_certificate_does_not_verify(operator, capsys):
    certificate = Certificate.load(operator.cert)
    import dataclasses

    forged = dataclasses.replace(certificate, role=Role.AUXILIARY)
    forged.save(operator.dir / "forged.cert")
    code, out, _ = run(capsys, "auth", "show", str(operator.dir / "forged.cert"))
    assert code == 1 and "does NOT verify: bad signature" in out


def test_revoke_creates_then_extends_the_list(operator, capsys):
    path = str(operator.dir / "revoked")
    code, out, _ = run(capsys, "auth", "revoke", "--authority", operator.key, "--run-id", "r1",
                       "--serial", "5", "--list", path)
    assert code == 0 and "sequence: 1" in out and "serials:  5" in out
    code, out, _ = run(capsys, "auth", "revoke", "--authority", operator.key, "--run-id", "r1",
                       "--serial", "9", "--serial", "7", "--list", path)
    assert code == 0 and "sequence: 2" in out and "serials:  5, 7, 9" in out
    revocations = RevocationList.load(path)
    assert revocations.sequence == 2 and revocations.serials == {5, 7, 9}
    assert revocations.problem(operator.authority_id, "r1", time.time()) is None
    code, out, _ = run(capsys, "auth", "show", path)
    assert code == 0 and "sequence:   2" in out and "verifies" in out


def test_revoke_refuses_a_list_of_another_run_or_authority(operator, capsys, tmp_path):
    path = str(operator.dir / "revoked")
    run(capsys, "auth", "revoke", "--authority", operator.key, "--run-id", "r1", "--serial",
        "5", "--list", path)
    code, _, err = run(capsys, "auth", "revoke", "--authority", operator.key, "--run-id", "r2",
                       "--serial", "6", "--list", path)
    one_line_error(code, err, "is for run 'r1', not 'r2'")
    run(capsys, "auth", "init", "--out", str(tmp_path / "other"))
    code, _, err = run(capsys, "auth", "revoke", "--authority",
                       str(tmp_path / "other/authority.key"), "--run-id", "r1", "--serial", "6",
                       "--list", path)
    one_line_error(code, err, "was signed by authority")
    assert RevocationList.load(path).sequence == 1


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("12h", 43200), ("7d", 604800),
                                           ("2w", 1209600), ("90s", 90)])
def test_durations(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "7x", "-1d", "0d", "1.5h", "d", ""])
def test_bad_durations(text):
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


@pytest.mark.parametrize("change, message", [
    ({"--peer-id": "abc"}, "must be a peer id"),
    ({"--peer-id": "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"}, "must be a peer id"),
    ({"--run-id": ""}, "run_id must be a non-empty string"),
    ({"--run-id": "x" * 200}, "at most 128 bytes"),
    ({"--role": "boss"}, "invalid choice"),
    ({"--expires": "7x"}, "must be a duration"),
    ({"--serial": "-3"}, "must be a positive integer"),
    ({"--authority": "missing.key"}, "does not exist"),
])
def test_issue_mistakes_are_one_line(operator, capsys, change, message):
    args = {"--authority": operator.key, "--run-id": "r1", "--peer-id": operator.peer_id,
            "--role": "trainer", "--expires": "7d", "--out": str(operator.dir / "x.cert")}
    args.update(change)
    argv = [item for pair in args.items() for item in pair]
    code, _, err = run(capsys, "auth", "issue", *argv)
    one_line_error(code, err, message)
    assert not (operator.dir / "x.cert").exists()


def test_issue_with_a_key_that_is_no_authority_key(operator, capsys):
    code, _, err = run(capsys, "auth", "issue", "--authority", operator.cert, "--run-id", "r1",
                       "--peer-id", operator.peer_id, "--role", "trainer", "--expires", "7d",
                       "--out", str(operator.dir / "x.cert"))
    one_line_error(code, err, "not a libp2p private key")


def test_show_mistakes_are_one_line(operator, capsys):
    code, _, err = run(capsys, "auth", "show", str(operator.dir / "nothing"))
    one_line_error(code, err, "does not exist")
    (operator.dir / "junk").write_text("hello\n")
    code, _, err = run(capsys, "auth", "show", str(operator.dir / "junk"))
    one_line_error(code, err, "neither a certificate nor a revocation list")
    code, _, err = run(capsys, "auth", "show", operator.key)
    one_line_error(code, err, "neither a certificate nor a revocation list")


# -- the membership flags of train and node --------------------------------------------

def _train(capsys, operator, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "train", "--listen", "/ip4/127.0.0.1/tcp/0", "--duration", "1", *argv)


def test_train_rejects_bad_membership_input(operator, capsys, tmp_path):
    other_id = run(capsys, "identity", "--identity", str(tmp_path / "other.key"))[1].strip()
    run(capsys, "auth", "init", "--out", str(tmp_path / "auth2"))
    other_authority = (tmp_path / "auth2" / "authority.id").read_text().strip()
    expired = Authority.load(operator.key).issue("r1", operator.peer_id, Role.TRAINER,
                                                 now=time.time() - 7200, expires_in=3600)
    expired.save(tmp_path / "expired.cert")
    stranger = Authority.load(tmp_path / "auth2" / "authority.key").issue(
        "r1", operator.peer_id, Role.TRAINER)
    stranger.save(tmp_path / "stranger.cert")
    (tmp_path / "allow.txt").write_text(f"{operator.peer_id}\n# a comment\nbogus\n")
    (tmp_path / "allow2.txt").write_text(f"{other_id}\n")
    member = ["--identity", operator.identity, "--authority", operator.authority_id]
    cases = [
        (["--run-id", "r1", *member, "--certificate", str(tmp_path / "none")],
         "does not exist"),
        (["--run-id", "r2", *member, "--certificate", operator.cert],
         "it is for run 'r1', not 'r2'"),
        (["--run-id", "r1", "--identity", str(tmp_path / "other.key"),
          "--authority", operator.authority_id, "--certificate", operator.cert],
         "not this peer"),
        (["--run-id", "r1", *member, "--certificate", str(tmp_path / "expired.cert")],
         "expired"),
        (["--run-id", "r1", "--identity", operator.identity, "--authority", other_authority,
          "--certificate", operator.cert], "not by --authority"),
        (["--run-id", "r1", *member, "--certificate", str(tmp_path / "stranger.cert")],
         "not by --authority"),
        (["--run-id", "r1", "--identity", operator.identity, "--certificate", operator.cert],
         "--certificate needs --authority"),
        (["--run-id", "r1", *member], "--authority needs --certificate"),
        (["--run-id", "r1", *member, "--certificate", operator.cert, "--allowlist",
          str(tmp_path / "allow.txt")], "two modes"),
        (["--run-id", "r1", "--identity", operator.identity, "--allowlist",
          str(tmp_path / "allow.txt")], "allow.txt:3"),
        (["--run-id", "r1", "--identity", operator.identity, "--allowlist",
          str(tmp_path / "allow2.txt")], "is not in the allowlist"),
        (["--run-id", "r1", "--identity", operator.identity, "--allowlist",
          str(tmp_path / "none.txt")], "does not exist"),
        (["--run-id", "r1", "--authority", "nope", "--certificate", operator.cert],
         "must be a peer id"),
        (["--run-id", ""], "run_id must be a non-empty string"),
    ]
    for argv, message in cases:
        code, _, err = _train(capsys, operator, *argv)
        one_line_error(code, err, message)


def test_train_refuses_a_revoked_certificate(operator, capsys):
    path = str(operator.dir / "revoked")
    run(capsys, "auth", "revoke", "--authority", operator.key, "--run-id", "r1",
        "--serial", "5", "--list", path)
    code, _, err = _train(capsys, operator, "--run-id", "r1", "--identity", operator.identity,
                          "--authority", operator.authority_id, "--certificate", operator.cert,
                          "--revocations", path)
    one_line_error(code, err, "serial 5 is revoked")
    code, _, err = _train(capsys, operator, "--run-id", "r1", "--identity", operator.identity,
                          "--revocations", path)
    one_line_error(code, err, "--revocations needs --authority")


def test_node_membership_flags_need_a_run(operator, capsys):
    code, _, err = run(capsys, "node", "--authority", operator.authority_id)
    one_line_error(code, err, "give --run-id")
    code, _, err = run(capsys, "node", "--run-id", "a", "--run-id", "b", "--identity",
                       operator.identity, "--authority", operator.authority_id,
                       "--certificate", operator.cert)
    one_line_error(code, err, "--certificate is for one run")
    code, _, err = run(capsys, "node", "--run-id", "r2", "--identity", operator.identity,
                       "--authority", operator.authority_id, "--certificate", operator.cert)
    one_line_error(code, err, "it is for run 'r1', not 'r2'")


def test_a_mistake_is_one_line_from_the_real_command(operator):
    result = subprocess.run(
        [sys.executable, "-m", "p2pdl", "train", "--run-id", "r2", "--identity",
         operator.identity, "--authority", operator.authority_id, "--certificate",
         operator.cert], capture_output=True, text=True, timeout=60,
        env={**os.environ, "HOME": str(operator.dir)})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"p2pdl: error: certificate {operator.cert}: it is for run 'r1', not 'r2'"]
    assert result.stdout == ""



@pytest.mark.timeout(180)
def test_the_readme_closed_run_works_as_written(tmp_path):
    """The README's closed run, with the ids it prints put in for the placeholders."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", readme, re.S)
                 if "p2pdl auth init" in b)
    commands = [re.sub(r"\s+#.*$", "", c).split() for c in
                block.replace("\\\n", " ").strip().splitlines()]
    assert [c[1] for c in commands] == ["auth", "identity", "auth", "train"]
    # Run in tmp_path (the README's relative paths), on this checkout's p2pdl.
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}

    def p2pdl(argv: list[str]) -> str:
        result = subprocess.run([sys.executable, "-m", "p2pdl", *argv], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=150)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    authority = re.search(r"authority id: (\S+)", p2pdl(commands[0][1:])).group(1)
    alice = p2pdl(commands[1][1:]).strip()
    fill = {"12D3KooW...alice": alice, "12D3KooW...authority": authority}
    p2pdl([fill.get(a, a) for a in commands[2][1:]])
    out = p2pdl([fill.get(a, a) for a in commands[3][1:]]
                + ["--listen", "/ip4/127.0.0.1/tcp/0", "--discovery-time", "0",
                   "--max-epochs", "1", "--target-batch-size", "16", "--json-lines"])
    ready = json.loads(out.splitlines()[0])
    assert ready["event"] == "ready" and ready["peer_id"] == alice
    assert ready["membership"] == "certificate" and authority in ready["membership_note"]


def _node_output(*argv: str, home: Path) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "p2pdl", "node", "--listen", "/ip4/127.0.0.1/tcp/0",
         "--duration", "0.5", *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, "HOME": str(home)})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def test_node_says_which_mode_each_run_is_in(operator, capsys):
    lines = _node_output("--run-id", "r1", "--run-id", "r2", home=operator.dir)
    assert lines[0].startswith("/ip4/127.0.0.1/")  # the addresses stay first
    assert [line for line in lines if "is open" in line] == [
        f"run {r!r} is open: anyone who knows the run id can join it (see "
        f"--authority/--certificate or --allowlist to close it)" for r in ("r1", "r2")]
    path = str(operator.dir / "revoked")
    run(capsys, "auth", "revoke", "--authority", operator.key, "--run-id", "r1",
        "--serial", "5", "--serial", "6", "--list", path)
    lines = _node_output("--run-id", "r1", "--authority", operator.authority_id,
                         "--revocations", path, home=operator.dir)
    assert any("is a certificate run" in line and "this node holds none" in line
               for line in lines), lines
    assert any(line.startswith("revocation list of run 'r1': sequence 1, 2 serial(s) revoked")
               for line in lines), lines
    lines = _node_output("--run-id", "r1", "--identity", operator.identity, "--authority",
                         operator.authority_id, "--certificate", operator.cert,
                         home=operator.dir)
    assert any("this peer is a trainer until" in line and "(serial 5)" in line
               for line in lines), lines
