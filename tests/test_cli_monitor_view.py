"""``p2pdl monitor``'s terminal view: what it draws of the views' document."""

from __future__ import annotations

from rich.console import Console

from p2pdl.cli._monitor_view import monitor_view
from p2pdl.monitor import History, Standing, run_state

from .monitor.test_history import PEERS, RUN, glance


def draw(state, top=5) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(monitor_view(state, top))
    return console.export_text()


def test_the_view_shows_epoch_throughput_peers_paths_loss_epochs_and_contributors():
    history = History()
    for t, epoch in ((0.0, 4), (10.0, 5), (20.0, 6)):
        history.observe(glance(t, epoch, epoch), t)
    board = [Standing("12D3KooWalice0000", 900, 3, 4, 6, "[bold]alice[/bold]"),
             Standing("12D3KooWbob000000", 700, 3, 4, 6, None)]
    text = draw(run_state(RUN, glance(20.0, 6, 6), history, board, 21.0))
    assert "epoch 6 (quorum 6)" in text and "300 / 1,000 samples 30%" in text
    assert "100.0 samples/s" in text and "ETA 7 s" in text
    assert "3 trainer(s), 1 auxiliary, 1 client(s)" in text
    assert "1 direct, 1 hole-punched, 1 relayed, 1 unsaid" in text and "loss 2.500" in text
    assert "last epochs" in text and "top contributors" in text and "peers in view" in text
    assert "1 averaged, 1 partial" in text and "2.5" in text   # epoch 5's rounds
    assert "[bold]alice[/bold]" in text          # a name's markup is shown, not obeyed
    assert "lice0000" in text[text.index("top contributors"):]   # the peer id's tail
    assert len(PEERS) == 4


def test_before_the_first_glance_it_says_it_waits():
    assert "waiting for the run's progress" in draw(run_state(RUN, None, History(), [], 0.0))
