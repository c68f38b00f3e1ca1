"""Training tasks: what ``p2pdl train --task MODULE:FACTORY`` runs.

A **task** is any object with these members (the built-in example,
:class:`~p2pdl.training.ExampleTask`, is one):

* ``batch_size`` -- samples per local step (an integer >= 1);
* ``build_model()`` -- a new model; every peer must get the same initial
  parameters, so seed inside it;
* ``batches(peer_index)`` -- an iterator of training batches for this peer
  (peers pass different indices, so they draw different data); when it ends
  it is called again for another pass;
* ``loss(model, batch)`` -- the batch's loss, a scalar tensor;

and optionally:

* ``build_optimizer(model)`` -- the torch optimizer to wrap (default: AdamW
  with ``--lr``);
* ``build_scheduler(optimizer)`` -- an LR scheduler of that optimizer,
  stepped by p2pdl once per global epoch (never by the loop);
* ``validation_loss(model, max_batches)`` -- a held-out loss (a float) for
  the ``eval`` events and the summary.

A **factory** is a callable in an importable module (or a ``.py`` file)
that returns a task; ``--task-arg KEY=VALUE`` passes keyword arguments to it
(as strings).  ``my_package.my_module:make_task`` imports the module (the
current directory is searched first, as ``python -m`` does);
``path/to/file.py:make_task`` loads the file.

:class:`TaskRunner` calls the task for the command line: whatever the task
raises, or a member it lacks, becomes a :class:`~p2pdl.errors.TaskError`
naming the task, the function and the line of the task's code where it
happened, not a traceback through p2pdl (the full traceback is logged at
debug level).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from ..errors import P2PDLError, TaskError
from .config import MAX_STEP_SAMPLES

__all__ = ["REQUIRED", "OPTIONAL", "Task", "TaskRunner", "load_task"]

logger = logging.getLogger(__name__)

#: The members every task has.
REQUIRED = ("batch_size", "build_model", "batches", "loss")
#: The members a task may have.
OPTIONAL = ("build_optimizer", "build_scheduler", "validation_loss")
#: A task's iterator that ends this many times in a row without a batch is an error.
MAX_EMPTY_PASSES = 2


@runtime_checkable
class Task(Protocol):
    """The protocol of a training task (the optional members are not listed here)."""

    batch_size: int

    def build_model(self) -> torch.nn.Module: ...

    def batches(self, peer_index: int) -> Iterator[Any]: ...

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor: ...


def _import_factory(spec: str) -> tuple[Callable[..., Any], str]:
    """The factory named by ``spec`` and the file its module came from."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise TaskError(f"--task {spec!r}: expected MODULE:FACTORY or FILE.py:FACTORY")
    try:
        if module_name.endswith(".py"):
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise TaskError(f"--task {spec}: no such file: {module_name}")
            name = "p2pdl_task_" + os.path.splitext(os.path.basename(path))[0]
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise TaskError(f"--task {spec}: cannot load {module_name}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except TaskError:
        raise
    except Exception as exc:
        raise TaskError(f"--task {spec}: importing {module_name} failed: "
                        f"{_described(exc, None)}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise TaskError(f"--task {spec}: {module_name} has no {attr!r}")
    if not callable(factory):
        raise TaskError(f"--task {spec}: {attr} is a {type(factory).__name__}, not a callable")
    return factory, getattr(module, "__file__", None) or ""


def _where(exc: BaseException, source: str | None) -> str:
    """`` (at FILE:LINE in FUNCTION)``: the deepest frame of the task's own file,
    else the deepest outside p2pdl and torch; or nothing."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            os.path.dirname(os.path.abspath(torch.__file__)))
    own = [f for f in frames if source and os.path.abspath(f.filename) == os.path.abspath(source)]
    user = [f for f in frames if not f.filename.startswith("<") and not os.path.abspath(
        f.filename).startswith(tuple(root + os.sep for root in ours))]
    chosen = (own or user or [None])[-1]
    if chosen is None:
        return ""
    return f" (at {chosen.filename}:{chosen.lineno} in {chosen.name})"


def _described(exc: BaseException, source: str | None) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}{': ' + first if first else ''}{_where(exc, source)}"


def load_task(spec: str, options: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """Import the factory ``spec`` names, call it with ``options`` and return
    the task with the file its factory came from.

    Raises :class:`~p2pdl.errors.TaskError` for a spec that names nothing
    callable, a factory that raises or refuses the options, or a task that
    lacks a required member.
    """
    factory, source = _import_factory(spec)
    options = dict(options or {})
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise TaskError(f"--task {spec}: the factory does not take "
                        f"{', '.join(sorted(options)) or 'no arguments'}: {exc}") from None
    except ValueError:  # no signature to check (a builtin): call it and see
        pass
    try:
        task = factory(**options)
    except P2PDLError as exc:
        raise TaskError(f"--task {spec}: the factory failed: {exc}") from None
    except Exception as exc:
        logger.debug("the task factory raised", exc_info=True)
        raise TaskError(f"--task {spec}: the factory raised "
                        f"{_described(exc, source)}") from None
    missing = [name for name in REQUIRED if not hasattr(task, name)]
    if missing:
        raise TaskError(f"--task {spec}: the task ({type(task).__name__}) lacks "
                        f"{', '.join(missing)}; a task has {', '.join(REQUIRED)} and "
                        f"may have {', '.join(OPTIONAL)} (docs/training.md)")
    return task, source


class TaskRunner:
    """Calls a task's members for a training loop, and turns what they raise
    into :class:`~p2pdl.errors.TaskError`.

    Args:
        task: the task object.
        name: how messages name it (``--task``'s value, or ``"the example"``).
        source: the file of the task's code, whose lines errors point to.
        passthrough: exceptions that are not the task's fault and pass
            unchanged (a stop signal raised while the task's code ran).
    """

    def __init__(self, task: Any, name: str, *, source: str | None = None,
                 passthrough: tuple[type[BaseException], ...] = ()) -> None:
        self.task = task
        self.name = name
        self.source = source
        self.passthrough = passthrough
        self._batches: Iterator[Any] | None = None
        self._peer_index = 0
        size = getattr(task, "batch_size", None)
        if isinstance(size, bool) or not isinstance(size, int) \
                or not 1 <= size <= MAX_STEP_SAMPLES:
            raise TaskError(f"task {name}: batch_size must be an integer in "
                            f"[1, {MAX_STEP_SAMPLES}], got {size!r}")
        self.batch_size = size

    def has(self, member: str) -> bool:
        """Whether the task has the optional ``member``."""
        return callable(getattr(self.task, member, None))

    def call(self, member: str, *args: Any) -> Any:
        """``task.member(*args)``; what it raises becomes a TaskError."""
        function = getattr(self.task, member, None)
        if not callable(function):
            raise TaskError(f"task {self.name}: {member} is not callable")
        return self.guard(f"{member}()", function, *args)

    def guard(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``; an error in it becomes a TaskError naming ``what``."""
        try:
            return function(*args)
        except (TaskError, StopIteration, *self.passthrough):
            raise
        except Exception as exc:
            logger.debug("the task's %s raised", what, exc_info=True)
            raise TaskError(f"task {self.name}: {what} raised "
                            f"{_described(exc, self.source)} (--log-level debug shows "
                            f"the traceback)") from None

    def build_model(self) -> torch.nn.Module:
        model = self.call("build_model")
        if not isinstance(model, torch.nn.Module):
            raise TaskError(f"task {self.name}: build_model() returned a "
                            f"{type(model).__name__}, not a torch.nn.Module")
        return model

    def build_optimizer(self, model: torch.nn.Module,
                        default: Callable[[torch.nn.Module], torch.optim.Optimizer]
                        ) -> torch.optim.Optimizer:
        """The task's optimizer, or ``default(model)`` where it has none."""
        if not self.has("build_optimizer"):
            return default(model)
        opt = self.call("build_optimizer", model)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TaskError(f"task {self.name}: build_optimizer() returned a "
                            f"{type(opt).__name__}, not a torch.optim.Optimizer")
        return opt

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The task's LR scheduler of ``optimizer``, or None."""
        if not self.has("build_scheduler"):
            return None
        scheduler = self.call("build_scheduler", optimizer)
        if scheduler is not None and not (callable(getattr(scheduler, "step", None))
                                          and callable(getattr(scheduler, "state_dict",
                                                               None))):
            raise TaskError(f"task {self.name}: build_scheduler() returned a "
                            f"{type(scheduler).__name__}, not an LR scheduler "
                            f"(with step and state_dict)")
        return scheduler

    def start(self, peer_index: int) -> None:
        """Begin this peer's batches."""
        self._peer_index = peer_index
        self._batches = self._iterator()

    def _iterator(self) -> Iterator[Any]:
        batches = self.call("batches", self._peer_index)
        try:
            return iter(batches)
        except TypeError:
            raise TaskError(f"task {self.name}: batches() returned a "
                            f"{type(batches).__name__}, not an iterable") from None

    def next_batch(self) -> Any:
        """The next training batch (a new pass when the iterator ends)."""
        if self._batches is None:
            self.start(self._peer_index)
        for _ in range(MAX_EMPTY_PASSES):
            assert self._batches is not None
            try:
                return self.guard("batches() (its next batch)", self._next)
            except StopIteration:
                self._batches = self._iterator()
        raise TaskError(f"task {self.name}: batches({self._peer_index}) yields no batch")

    def _next(self) -> Any:
        assert self._batches is not None
        return next(self._batches)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The batch's loss, checked to be a scalar tensor with a gradient."""
        loss = self.call("loss", model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) \
                else f"a {type(loss).__name__}"
            raise TaskError(f"task {self.name}: loss() returned {got}, not a scalar tensor")
        if not loss.requires_grad:
            raise TaskError(f"task {self.name}: loss() returned a tensor without a "
                            f"gradient (computed under no_grad, or not from the model)")
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, its errors the task's (they come from its model)."""
        self.guard("loss().backward()", loss.backward)

    def validation_loss(self, model: torch.nn.Module, max_batches: int) -> float | None:
        """The task's held-out loss, or None where it has no ``validation_loss``."""
        if not self.has("validation_loss"):
            return None
        value = self.call("validation_loss", model, max_batches)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TaskError(f"task {self.name}: validation_loss() returned a "
                            f"{type(value).__name__}, not a number") from None
