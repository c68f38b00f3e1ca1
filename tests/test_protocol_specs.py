"""Every protocol id and definition in protocols/ matches the code."""

from __future__ import annotations

import pathlib
import re

import p2pdl.nat as nat
import p2pdl.wire as wire
from p2pdl.nat import DIALBACK_PROTOCOL_ID, ReachabilityConfig
from p2pdl.nat._messages import MAX_DIALBACK_ADDRS
from p2pdl.net import HostConfig, RelayLimits
from p2pdl.net._host import MAX_RELAY_ROUTES
from p2pdl.net._relay import REFRESH_AT
from p2pdl.wire import PING_PROTOCOL_ID, WireConfig
from p2pdl.wire._ping import MAX_PING_PAYLOAD

SPECS = pathlib.Path(__file__).resolve().parents[1] / "protocols"

#: Protocol ids defined in the code, by spec file.
CODE_IDS = {"ping.md": PING_PROTOCOL_ID, "transport.md": DIALBACK_PROTOCOL_ID}


def spec(name: str) -> str:
    return (SPECS / name).read_text()


def definitions(text: str) -> dict[str, str]:
    """The ``| name | value | meaning |`` rows of a spec's Definitions table."""
    section = text.split("## Definitions", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] not in ("name", "") and not cells[0].startswith("-"):
            rows[cells[0]] = cells[1]
    return rows


def number(value: str) -> float:
    return float(re.match(r"[0-9.]+", value).group())


def test_every_spec_states_its_protocol_id_literally():
    for path in sorted(SPECS.glob("*.md")):
        if path.name in ("README.md", "wire.md"):
            continue
        ids = re.findall(r"The protocol ID is `([^`]+)`", path.read_text())
        assert ids == [CODE_IDS[path.name]], path.name


def test_every_protocol_id_in_the_code_has_a_spec():
    ids_in_code = {v for module in (wire, nat) for k, v in vars(module).items()
                   if k.endswith("PROTOCOL_ID")}
    assert ids_in_code <= set(CODE_IDS.values())
    for protocol_id in CODE_IDS.values():
        assert re.fullmatch(r"/p2pdl/[a-z0-9-]+/\d+\.\d+\.\d+", protocol_id)


def test_index_lists_every_spec():
    index = spec("README.md")
    for path in SPECS.glob("*.md"):
        if path.name != "README.md":
            assert f"]({path.name})" in index, path.name


def test_wire_definitions_match_the_code():
    rows = definitions(spec("wire.md"))
    assert number(rows["FRAME_HEADER_SIZE"]) == wire.config.FRAME_HEADER_SIZE
    assert number(rows["MAX_FRAME_PAYLOAD"]) == wire.MAX_FRAME_PAYLOAD
    assert number(rows["INITIAL_CREDIT"]) == wire.INITIAL_CREDIT
    assert number(rows["MIN_RECEIVE_WINDOW"]) == wire.MIN_RECEIVE_WINDOW
    defaults = WireConfig()
    for field in ("max_message_size", "max_tensor_frame_size", "receive_window",
                  "tensor_chunk_size", "send_timeout", "max_inflight_requests",
                  "handler_timeout", "rpc_idle_timeout", "call_timeout"):
        assert number(rows[field]) == getattr(defaults, field), field
    assert number(rows["credit_batch"]) == defaults.effective_credit_batch


def test_wire_error_codes_match_the_code():
    text = spec("wire.md")
    for code in wire.ERROR_CODES:
        assert f"| `{code}` |" in text, code


def test_ping_definitions_match_the_code():
    assert number(definitions(spec("ping.md"))["MAX_PING_PAYLOAD"]) == MAX_PING_PAYLOAD


def test_tensor_dtypes_match_the_code():
    listed = re.search(r"one of `([^`]+)`", spec("wire.md")).group(1).split()
    assert sorted(listed) == sorted(wire.DTYPE_SIZES)


def test_transport_definitions_match_the_code():
    rows = definitions(spec("transport.md"))
    host, relay, reach = HostConfig(), RelayLimits(), ReachabilityConfig()
    assert number(rows["dial_timeout"]) == host.dial_timeout
    assert number(rows["relay_reservations"]) == host.relay_reservations
    for field in ("max_reservations", "max_circuits_per_peer", "max_circuit_bytes",
                  "max_circuit_duration", "reservation_ttl"):
        assert number(rows[field]) == getattr(relay, field), field
    for field in ("probe_timeout", "min_failures", "unknown_interval", "public_interval",
                  "private_interval", "result_ttl", "max_addrs", "server_concurrency",
                  "server_min_interval"):
        assert number(rows[field]) == getattr(reach, field), field
    assert number(rows["REFRESH_AT"]) == REFRESH_AT
    assert number(rows["MAX_RELAY_ROUTES"]) == MAX_RELAY_ROUTES
    assert number(rows["MAX_DIALBACK_ADDRS"]) == MAX_DIALBACK_ADDRS
