"""p2pdl.service: statistics records, run ids, number checks, endpoints (sans-IO parts)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from p2pdl.errors import ConfigError
from p2pdl.service import (
    MAX_RUN_ID_BYTES,
    Reachability,
    RpcEndpoint,
    Statistics,
    check_run_id,
    is_int,
    is_number,
    is_positive,
    no_run,
    run_id_problem,
    run_of_request,
)
from p2pdl.wire import Message, RpcProtocol


@dataclasses.dataclass(frozen=True)
class Inner(Statistics):
    hits: int = 0


@dataclasses.dataclass(frozen=True)
class Outer(Statistics):
    name: str
    inner: Inner
    reach: Reachability
    runs: list[str]
    sent: int = 0
    failed: int = 0
    on: bool = False


def test_statistics_are_frozen_records_that_read_as_mappings():
    stats = Outer("n", Inner(3), Reachability.PUBLIC, ["a"], sent=2)
    assert stats.sent == stats["sent"] == 2
    assert stats["inner"]["hits"] == 3
    assert list(stats) == ["name", "inner", "reach", "runs", "sent", "failed", "on"]
    assert len(stats) == 7 and "sent" in stats and "nope" not in stats
    with pytest.raises(KeyError):
        stats["nope"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.sent = 5  # type: ignore[misc]
    plain = stats.as_dict()
    assert plain == {"name": "n", "inner": {"hits": 3}, "reach": "public", "runs": ["a"],
                     "sent": 2, "failed": 0, "on": False}
    json.dumps(plain)
    assert Outer.counter_names() == ("sent", "failed")


def test_a_run_id_has_one_meaning_bytes_of_utf8():
    assert check_run_id("r") == "r"
    assert check_run_id("x" * MAX_RUN_ID_BYTES) == "x" * MAX_RUN_ID_BYTES
    assert run_id_problem("é" * 64) is None  # 128 bytes
    for bad in ("", "x" * (MAX_RUN_ID_BYTES + 1), "é" * 65, 5, None, b"run"):
        assert run_id_problem(bad) is not None
        with pytest.raises(ConfigError, match="run_id must be"):
            check_run_id(bad)
    assert "..." in run_id_problem("x" * 500)  # a long id is not echoed whole


def test_number_checks():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(2.5) and not is_number(float("nan")) and not is_number(False)
    assert is_positive(1e-9) and not is_positive(0) and not is_positive(float("inf"))


class Ask(Message, tag="test.ask"):
    run_id: str


class Plain(Message, tag="test.plain"):
    x: int


def test_endpoints_say_which_run_a_request_is_for():
    assert run_of_request(Ask("r1")) == "r1"
    assert run_of_request(Plain(1)) is None
    assert no_run(Ask("r1")) is None
    protocol = RpcProtocol.define("/test/ask/1.0.0", [Ask, Plain], [Plain])

    async def handler(ctx, request):
        return Plain(0)

    endpoint = RpcEndpoint(protocol, handler, run_id_of=run_of_request)
    assert endpoint.protocol_id == "/test/ask/1.0.0"
    assert RpcEndpoint(protocol, handler).run_id_of is no_run
