"""The monitor's web dashboard: its answers, and the page in a real headless
Chromium (Debian's ``chromium``, installed by ``.ci/run``) following a live run.

The page test writes screenshots (a phone's and a desktop's width) to
``test-artifacts/`` at the repository's root, or to ``$P2PDL_ARTIFACTS``.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import urllib.request

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from p2pdl.monitor import CreditStore, Dashboard, follow_run, serve_dashboard
from p2pdl.testing import open_memory_nodes, wait_for_dht, wait_until

RUN = "dash-run"
ROOT = pathlib.Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: A name with markup in it: the page must show it as text.
SNEAKY = "<b>mallory</b>"


def artifacts() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("P2PDL_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def chromium_flags(profile: pathlib.Path) -> list[str]:
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}"]


def test_the_answers_are_bounded_and_safe():
    with CreditStore(":memory:") as store:
        dashboard = Dashboard(RUN, store, clock=lambda: 10.0)
        status, headers, page = dashboard.answer("/")
        headers = dict(headers)
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert b'<script src="dashboard.js">' in page and b"http" not in page.lower().replace(
            b"http-equiv", b"")   # nothing fetched from elsewhere
        status, headers, script = dashboard.answer("/dashboard.js")
        assert status == 200 and dict(headers)["content-type"].startswith("text/javascript")
        assert b"innerHTML" not in script and b"textContent" in script
        assert dashboard.page_bytes == len(page) + len(script)
        status, headers, body = dashboard.answer("/api/state")
        assert status == 200 and dict(headers)["cache-control"] == "no-store"
        assert json.loads(body)["run_id"] == RUN and json.loads(body)["status"] is None
        assert dashboard.answer("/metrics")[0] == 404        # no node given
        assert dashboard.answer("/../etc/passwd")[0] == 404


def fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, dict(answer.headers), answer.read()


@pytest.mark.timeout(180)
async def test_the_page_in_headless_chromium_shows_the_live_run(tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs Debian's chromium for this test (.ci/run)")
        pytest.skip("needs Chromium (apt-get install chromium)")
    async with open_memory_nodes(3) as nodes:
        await wait_for_dht(nodes)
        a, b, monitor = nodes
        store = CreditStore(tmp_path / "credits.sqlite")
        dashboard = Dashboard(RUN, store)
        async with a.progress.track(RUN, 100, name="alice") as ta, \
                b.progress.track(RUN, 100, name=SNEAKY) as tb, trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_dashboard, monitor, dashboard,
                                             "127.0.0.1:0")
            await nursery.start(functools.partial(
                follow_run, monitor, RUN, store, target_batch_size=100, interval=0.1,
                on_glance=dashboard.observe))
            for epoch in range(3):   # three epochs complete: credits, points, epochs
                # each one's part of the last round took the other's values
                said_a = {"last_round": (epoch - 1, "averaged", 2, (b.peer_id,))} if epoch \
                    else {}
                said_b = {"last_round": (epoch - 1, "averaged", 2, (a.peer_id,))} if epoch \
                    else {}
                ta.report(60, epoch, loss=3.0 - epoch / 2, samples_per_second=30.0 + epoch,
                          **said_a)
                tb.report(50, epoch, loss=3.5 - epoch / 2, samples_per_second=25.0 - epoch,
                          **said_b)
                await wait_until(lambda e=epoch: dashboard.glance is not None
                                 and len(dashboard.glance.peers) == 2
                                 and all(p.epoch == e and p.samples_accumulated
                                         for p in dashboard.glance.peers), 30, step=0.05)
                await trio.sleep(2.1)   # a point per epoch (the history's spacing)
                ta.update_epoch(epoch + 1)
                tb.update_epoch(epoch + 1)
            ta.report(30, 3, loss=1.25, last_round=(2, "averaged", 2, (b.peer_id,)))
            tb.report(0, 3, last_round=(2, "partial", 2, (a.peer_id,)))
            await wait_until(lambda: len(store.leaderboard(RUN)) == 2
                             and dashboard.state()["status"]["epoch"] == 3, 30, step=0.05)
            url = f"http://{host}:{port}/"

            # The JSON and the metrics, as any client gets them.
            status, headers, body = await trio.to_thread.run_sync(fetch, url + "api/state")
            state = json.loads(body)
            assert {s["name"] for s in state["leaderboard"]} == {"alice", SNEAKY}
            _, _, metrics = await trio.to_thread.run_sync(fetch, url + "metrics")
            names = {f.name for f in text_string_to_metric_families(metrics.decode())}
            assert "p2pdl_progress_view_epoch" in names or any(
                n.startswith("p2pdl_progress") for n in names), sorted(names)[:20]

            # The page, rendered by Chromium with its script run against the live monitor.
            result = await trio.run_process(
                [*chromium_flags(tmp_path / "profile"), "--virtual-time-budget=8000",
                 "--dump-dom", url], capture_stdout=True, capture_stderr=True)
            dom = result.stdout.decode()
            shots = artifacts()
            for name, size in (("dashboard-phone.png", "412,915"),
                               ("dashboard-desktop.png", "1280,1000")):
                await trio.run_process(
                    [*chromium_flags(tmp_path / f"profile-{name}"), "--virtual-time-budget=8000",
                     f"--window-size={size}", f"--screenshot={shots / name}", url],
                    capture_stdout=True, capture_stderr=True)
            nursery.cancel_scope.cancel()
        store.close()
    assert 'id="epoch">3<' in dom, dom[:3000]
    assert re.search(r'id="peers">2 · 0 · 0<', dom), dom[:3000]
    board = dom[dom.index('id="leaderboard"'):]
    board = board[:board.index("</tbody>")]
    assert "alice" in board and "&lt;b&gt;mallory&lt;/b&gt;" in board, board
    assert "<b>mallory</b>" not in dom                    # shown as text, never as markup
    assert 'id="loss">1.' in dom and "live · updated" in dom
    epochs = dom[dom.index('id="epochs"'):]
    epochs = epochs[:epochs.index("</tbody>")]
    assert "1 averaged, 1 partial" in epochs and "2 averaged" in epochs, epochs
    assert dom.count("<path") >= 3                        # the charts drew their lines
    for name in ("dashboard-phone.png", "dashboard-desktop.png"):
        png = (shots / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name


def test_the_guides_snippets_compile():
    import ast

    guide = ROOT / "docs" / "monitor.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)
    assert len(blocks) >= 2
    for number, block in enumerate(blocks, 1):
        compile(block, f"docs/monitor.md, python block {number}", "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
