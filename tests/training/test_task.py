"""Training tasks (``p2pdl train --task``): loading a factory, calling a task,
and what a broken task reports."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from p2pdl.errors import TaskError
from p2pdl.training import ExampleConfig, ExampleTask, Task, TaskRunner, load_task

TASK_SOURCE = textwrap.dedent('''
    import torch

    class Regression:
        def __init__(self, batch_size="8", fail="", passes="0"):
            self.batch_size = int(batch_size)
            self.fail = fail
            self.passes = int(passes)
            self.w = torch.randn(4, generator=torch.Generator().manual_seed(0))

        def build_model(self):
            torch.manual_seed(0)
            return torch.nn.Linear(4, 1)

        def batches(self, peer_index):
            if self.fail == "batches":
                raise RuntimeError("no data for peer %d" % peer_index)
            g = torch.Generator().manual_seed(100 + peer_index)
            for _ in range(self.passes):
                x = torch.randn(self.batch_size, 4, generator=g)
                yield x, x @ self.w

        def loss(self, model, batch):
            x, y = batch
            if self.fail == "loss":
                raise ValueError("bad batch shape")
            if self.fail == "vector":
                return (model(x).squeeze(-1) - y) ** 2
            if self.fail == "detached":
                return torch.tensor(1.0)
            return torch.nn.functional.mse_loss(model(x).squeeze(-1), y)

    def make_task(**kw):
        return Regression(**kw)

    def make_nothing():
        return object()

    def make_raising():
        return {}["missing"]

    NOT_CALLABLE = 3
''')


@pytest.fixture
def task_module(tmp_path, monkeypatch):
    path = tmp_path / "user_task_module.py"
    path.write_text(TASK_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("user_task_module", None)
    yield path
    sys.modules.pop("user_task_module", None)


def test_a_factory_is_imported_from_the_current_directory_and_called_with_its_options(
        task_module):
    task, source = load_task("user_task_module:make_task", {"batch_size": "5", "passes": "2"})
    assert source == str(task_module)
    assert isinstance(task, Task)
    runner = TaskRunner(task, "t", source=source)
    assert runner.batch_size == 5
    runner.start(peer_index=1)
    model = runner.build_model()
    loss = runner.loss(model, runner.next_batch())
    runner.backward(loss)
    assert model.weight.grad is not None


def test_a_factory_is_loaded_from_a_file_path(task_module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path.parent)
    task, source = load_task(f"{task_module}:make_task")
    assert type(task).__name__ == "Regression" and source == str(task_module)


def test_an_ended_iterator_starts_a_new_pass_and_an_empty_one_is_an_error(task_module):
    task, source = load_task("user_task_module:make_task", {"passes": "1"})
    runner = TaskRunner(task, "t", source=source)
    runner.start(0)
    first = runner.next_batch()
    again = runner.next_batch()  # the iterator ended: a second pass, the same data
    assert torch.equal(first[0], again[0])
    empty = TaskRunner(load_task("user_task_module:make_task", {"passes": "0"})[0], "t")
    with pytest.raises(TaskError, match=r"batches\(0\) yields no batch"):
        empty.next_batch()


@pytest.mark.parametrize("spec, options, message", [
    ("user_task_module", {}, "expected MODULE:FACTORY"),
    ("user_task_module:absent", {}, "user_task_module has no 'absent'"),
    ("user_task_module:NOT_CALLABLE", {}, "NOT_CALLABLE is a int, not a callable"),
    ("no_such_module_here:make", {}, "importing no_such_module_here failed: "
                                     "ModuleNotFoundError"),
    ("missing_file.py:make", {}, "no such file: missing_file.py"),
    ("user_task_module:make_nothing", {}, "lacks batch_size, build_model, batches, loss"),
    ("user_task_module:make_nothing", {"x": "1"}, "the factory does not take x"),
    ("user_task_module:make_raising", {}, "the factory raised KeyError: 'missing' "
                                          r"\(at .*user_task_module.py:\d+ in make_raising\)"),
])
def test_a_task_that_does_not_load_is_one_clear_error(task_module, spec, options, message):
    with pytest.raises(TaskError, match=message):
        load_task(spec, options)


@pytest.mark.parametrize("fail, call, message", [
    ("loss", "loss", r"loss\(\) raised ValueError: bad batch shape "
                     r"\(at .*user_task_module.py:\d+ in loss\)"),
    ("batches", "batches", r"batches\(\) \(its next batch\) raised RuntimeError: "
                           r"no data for peer 3 \(at .*user_task_module.py:\d+ in batches\)"),
    ("vector", "loss", r"loss\(\) returned a tensor of shape \(8,\), not a scalar tensor"),
    ("detached", "loss", r"loss\(\) returned a tensor without a gradient"),
])
def test_an_error_in_the_task_names_the_function_and_the_line(task_module, fail, call,
                                                              message):
    task, source = load_task("user_task_module:make_task", {"fail": fail, "passes": "2"})
    runner = TaskRunner(task, "user_task_module:make_task", source=source)
    runner.start(3)
    with pytest.raises(TaskError, match="task user_task_module:make_task: " + message):
        model = runner.build_model()
        runner.loss(model, runner.next_batch())


def test_a_passthrough_exception_is_not_the_tasks_error(task_module):
    class Stop(Exception):
        pass

    def stopped(*_):
        raise Stop

    runner = TaskRunner(load_task("user_task_module:make_task")[0], "t", passthrough=(Stop,))
    with pytest.raises(Stop):
        runner.guard("x", stopped)


@pytest.mark.parametrize("size", [0, -1, True, 2.5, None])
def test_a_bad_batch_size_is_refused(size):
    class Bad:
        batch_size = size

    with pytest.raises(TaskError, match="batch_size must be an integer"):
        TaskRunner(Bad(), "bad")


def test_the_example_is_a_task():
    task = ExampleTask(ExampleConfig(batch_size=4))
    assert isinstance(task, Task)
    runner = TaskRunner(task, "the example")
    assert runner.batch_size == 4
    model = runner.build_model()
    runner.start(0)
    batch = runner.next_batch()
    assert torch.equal(runner.loss(model, batch), model.loss(batch))
    assert runner.has("validation_loss") and not runner.has("build_optimizer")
    assert runner.validation_loss(model, 1) == task.validation_loss(model, max_batches=1)


def test_optional_members_build_the_optimizer_and_scheduler_or_fall_back():
    class WithOptimizer:
        batch_size = 2

        def build_model(self):
            return torch.nn.Linear(2, 1)

        def batches(self, peer_index):
            yield torch.zeros(2, 2)

        def loss(self, model, batch):
            return model(batch).sum()

        def build_optimizer(self, model):
            return torch.optim.SGD(model.parameters(), lr=0.5)

        def build_scheduler(self, optimizer):
            return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    runner = TaskRunner(WithOptimizer(), "w")
    model = runner.build_model()
    opt = runner.build_optimizer(model, lambda m: pytest.fail("the default was used"))
    assert isinstance(opt, torch.optim.SGD)
    assert isinstance(runner.build_scheduler(opt), torch.optim.lr_scheduler.StepLR)
    assert runner.validation_loss(model, 1) is None

    class Plain(WithOptimizer):
        build_optimizer = None
        build_scheduler = None

    plain = TaskRunner(Plain(), "p")
    opt = plain.build_optimizer(model, lambda m: torch.optim.Adam(m.parameters()))
    assert isinstance(opt, torch.optim.Adam) and plain.build_scheduler(opt) is None

    class Wrong(WithOptimizer):
        def build_optimizer(self, model):
            return "sgd"

    with pytest.raises(TaskError, match=r"build_optimizer\(\) returned a str"):
        TaskRunner(Wrong(), "w").build_optimizer(model, lambda m: None)


def test_the_documented_task_runs(tmp_path, monkeypatch):
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    source = text.split("```python\n# regression_task.py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "regression_task.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("regression_task", None)
    task, path = load_task("regression_task:make_task")
    runner = TaskRunner(task, "regression_task:make_task", source=path)
    model = runner.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    runner.start(0)
    losses = []
    for _ in range(30):
        loss = runner.loss(model, runner.next_batch())
        runner.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    sys.modules.pop("regression_task", None)
