"""The house rules, checked on the code itself (docs/architecture.md).

* Layers import only downward, and no module imports itself back (no circle).
* No module uses another package's private (``_``) modules or names.
* Every name a package ``__init__`` re-exports exists, and every package's
  docstring names each of its modules.
* ``import p2pdl`` does not load torch.
* Every protocol package has the same inner shape (``config``, ``_messages``,
  a sans-IO core, ``_service``); its logic is sans-IO: only ``_service`` and
  the I/O modules named in IO_MODULES import trio or sockets; no ``_service``
  module grows past MAX_SERVICE_LINES.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "p2pdl"

#: Layers, bottom to top: a module may import its own layer and those below.
#: Root modules (``p2pdl/_node.py``...) are the node layer; ``errors``,
#: ``_concurrency`` and ``_version`` are shared by every layer.
LAYERS = {
    "errors": 0, "_concurrency": 0, "_version": 0,
    "net": 1, "netlab": 1,
    "wire": 2,
    "service": 3,
    "nat": 4,
    "dht": 5,
    "progress": 6, "statesync": 6, "membership": 6,
    "averaging": 7,
    "training": 8,
    "": 9,  # the node: p2pdl/__init__.py, _node, _config, _portal, _faces, _sync_node
    "metrics": 10, "monitor": 11,
    "cli": 12, "testing": 12, "hf": 12,
}
#: Root modules every layer may import although their names are private.
SHARED = {"_concurrency", "_version"}
#: The modules of protocol packages, beside ``_service``, that do I/O (trio):
#: each holds one side of a service's work (the all-reduce's sender, reducer,
#: disputes...; state sync's fetcher).  Every other module of a protocol
#: package is sans-IO.
IO_MODULES = {
    "p2pdl.averaging.allreduce": {"_accusing", "_disputes", "_exchange", "_reducing",
                                  "_sending", "_session"},
    "p2pdl.statesync": {"_fetcher"},
    "p2pdl.dht": {"_relaying"},
}
#: The longest a ``_service.py`` may be (lines): wiring of one protocol, not its logic.
MAX_SERVICE_LINES = 700
#: What a module does I/O with.
IO_IMPORTS = ("trio", "socket", "asyncio", "threading")


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = modules()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports_of(name: str) -> list[tuple[str, list[str]]]:
    """``(module imported, names taken from it)`` for every import in ``name``,
    whether at the top, under TYPE_CHECKING or inside a function."""
    tree = ast.parse(MODULES[name].read_text())
    here = name if is_package(name) else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names if alias.name.startswith("p2pdl")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("p2pdl"):
                continue
            names = [alias.name for alias in node.names]
            # ``from pkg import sub`` imports the module ``pkg.sub``
            subs = [n for n in names if f"{target}.{n}" in MODULES]
            for sub in subs:
                out.append((f"{target}.{sub}", []))
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                out.append((target, rest))
    return out


def top(name: str) -> str:
    """The layer package of a module: ``p2pdl.averaging.allreduce._state`` -> ``averaging``;
    root modules -> ``""`` (except the shared ones)."""
    parts = name.split(".")
    if len(parts) == 1:
        return ""
    if parts[1] == "__main__":  # ``python -m p2pdl``: the command line
        return "cli"
    if len(parts) == 2 and not (PACKAGE / parts[1]).is_dir():
        return parts[1] if parts[1] in LAYERS and LAYERS[parts[1]] == 0 else ""
    return parts[1]


def test_every_package_has_a_layer():
    assert {top(m) for m in MODULES} <= LAYERS.keys()


def test_layers_import_only_downward():
    upward = []
    for name in MODULES:
        for target, _ in imports_of(name):
            if target in MODULES and LAYERS[top(target)] > LAYERS[top(name)]:
                upward.append(f"{name} -> {target}")
            elif (target in MODULES and top(target) != top(name)
                  and LAYERS[top(target)] == LAYERS[top(name)] and LAYERS[top(name)] not in (0,)):
                upward.append(f"{name} -> {target} (same layer, another package)")
    assert not upward, "\n".join(upward)


def test_no_module_imports_another_packages_private_parts():
    private = []
    for name in MODULES:
        mine = top(name)
        for target, names in imports_of(name):
            theirs = top(target)
            if theirs == mine:
                continue
            parts = target.split(".")[1:]
            if parts and parts[0] in SHARED:
                continue
            if any(p.startswith("_") for p in parts) or any(
                    n.startswith("_") and not n.endswith("__") for n in names):
                private.append(f"{name} -> {target} {names}")
    assert not private, "\n".join(private)


def test_no_import_circle():
    graph = {name: {t for t, _ in imports_of(name) if t in MODULES and t != name}
             for name in MODULES}
    # A package imports its submodules to re-export them; a submodule that
    # imports its own package's __init__ back would be a circle -- keep that edge.
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [node, nxt])
                              if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for name in MODULES:
        if name not in state:
            visit(name, [])
    # Parent packages re-export their subpackages (p2pdl.averaging -> .allreduce),
    # and a submodule reaches a sibling through the parent's directory, not its
    # __init__; only cycles through real modules count.
    real = [c for c in cycles if not all(is_package(m.strip()) for m in c.split("->")[:-1])]
    assert not real, "\n".join(real)


@pytest.mark.parametrize("package", sorted(n for n in MODULES if is_package(n)))
def test_re_exports_exist(package):
    module = importlib.import_module(package)
    tree = ast.parse(MODULES[package].read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                exported = alias.asname or alias.name
                assert hasattr(module, exported), f"{package}.{exported}"
    for name in getattr(module, "_LAZY", {}):
        assert getattr(module, name) is not None


@pytest.mark.parametrize("package", sorted(n for n in MODULES if is_package(n)))
def test_package_docstring_names_its_modules(package):
    directory = MODULES[package].parent
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    names = [p.stem for p in directory.glob("*.py") if p.stem not in ("__init__", "__main__")]
    names += [p.name for p in directory.iterdir()
              if p.is_dir() and (p / "__init__.py").exists()]
    if package == "p2pdl":  # the root's map names its layer packages; _node etc. below
        names = [n for n in names if not n.startswith("_") or n in ("_node", "_sync_node")]
    missing = [n for n in names if not any(form in doc for form in
                                           (f"``{n}``", f"``{n}.py``", f"``p2pdl.{n}``"))]
    assert not missing, f"{package} docstring does not name {missing}"


def test_import_p2pdl_does_not_load_torch():
    code = ("import p2pdl, p2pdl.cli, p2pdl.testing, sys; "
            "assert 'torch' not in sys.modules, 'torch was imported'; "
            "p2pdl.Node; p2pdl.open_node; p2pdl.MatchmakingConfig")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)


def protocol_packages() -> list[str]:
    return sorted(name.rsplit(".", 1)[0] for name in MODULES if name.endswith("._service"))


def test_protocol_packages_have_the_same_inner_shape():
    odd = []
    for package in protocol_packages():
        has = {name.rsplit(".", 1)[1] for name in MODULES if name.startswith(package + ".")}
        if not {"config", "_messages", "_state", "_service"} <= has:
            odd.append(f"{package}: {sorted(has)}")
    assert protocol_packages() and not odd, "\n".join(odd)


def test_protocol_logic_is_sans_io_outside_the_services():
    doing_io, stale = [], []
    for package in protocol_packages():
        allowed = IO_MODULES.get(package, set()) | {"_service"}
        for name, path in MODULES.items():
            if not name.startswith(package + ".") or name.count(".") != package.count(".") + 1:
                continue
            module = name.rsplit(".", 1)[1]
            tree = ast.parse(path.read_text())
            found = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    found.add(node.module.split(".")[0])
            io = sorted(found & set(IO_IMPORTS))
            if io and module not in allowed:
                doing_io.append(f"{name} imports {io}")
            if module in IO_MODULES.get(package, set()) and not io:
                stale.append(f"{name} is in IO_MODULES but does no I/O")
    assert not doing_io and not stale, "\n".join(doing_io + stale)


def test_services_are_wiring_not_logic():
    long = [f"{name}: {len(path.read_text().splitlines())} lines"
            for name, path in MODULES.items() if name.endswith("._service")
            and len(path.read_text().splitlines()) > MAX_SERVICE_LINES]
    assert not long, "\n".join(long)


def test_protocol_code_touches_no_private_member_of_another_object():
    """In the protocol packages an object's ``_members`` are its own: nothing
    reads or writes ``other._name`` (only ``self._name`` and ``cls._name``)."""
    found = []
    for package in protocol_packages():
        for name, path in MODULES.items():
            if not name.startswith(package + "."):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                        and not node.attr.startswith("__") \
                        and not (isinstance(node.value, ast.Name)
                                 and node.value.id in ("self", "cls")):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_each_service_is_named_after_its_package():
    """Every entry of ``SERVICES`` is named after the package of its service
    class (``node.<name>``, the statistics field and the faces take that
    name), has the ``NodeConfig`` field of that name, and declares both
    faces unless the node shows it itself; the type lines of ``TrioNode``,
    ``Node`` and ``AsyncioNode`` name the same services."""
    import typing

    from p2pdl import SERVICES, AsyncioNode, Node, NodeConfig, NodeStatistics, TrioNode

    stats = {f.name for f in dataclasses.fields(NodeStatistics)}
    config = {f.name for f in dataclasses.fields(NodeConfig)}
    for entry in SERVICES:
        name = entry.name
        assert entry.service.__module__.split(".")[-2] == name, (name, entry.service)
        assert name in stats and name in config, name
        assert typing.get_type_hints(TrioNode)[name] is entry.service, name
        if name in WITHOUT_FACES:
            assert entry.sync_face is None and entry.aio_face is None
            continue
        assert entry.sync_face is not None and entry.aio_face is not None, name
        assert name in typing.get_type_hints(Node) and name in typing.get_type_hints(AsyncioNode)


def test_tests_take_a_name_from_its_package_when_the_package_exports_it():
    """A test imports an internal module only for what has no public home."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("p2pdl.")):
                continue
            parts = node.module.split(".")
            private = [i for i, part in enumerate(parts) if part.startswith("_")]
            if not private:
                continue
            public = importlib.import_module(".".join(parts[:private[0]]))
            module = importlib.import_module(node.module)
            for alias in node.names:
                here = getattr(module, alias.name, None)
                if here is not None and getattr(public, alias.name, None) is here:
                    found.append(f"{path.relative_to(ROOT)}: {alias.name} from {node.module} "
                                 f"(public in {public.__name__})")
    assert not found, "\n".join(found)


#: Services the sync and asyncio nodes show through the node itself, not a face
#: (``node.reachability``, ``node.client_mode``, ``node.paths``).
WITHOUT_FACES = {"nat"}
