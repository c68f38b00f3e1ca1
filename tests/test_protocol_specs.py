"""Every protocol id and definition in protocols/ matches the code."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import pathlib
import re

import blake3
import msgpack

import p2pdl.averaging as averaging
import p2pdl.dht as dht
import p2pdl.membership as membership
import p2pdl.nat as nat
import p2pdl.progress as progress
import p2pdl.statesync as statesync
import p2pdl.wire as wire
from p2pdl.averaging import (
    AGGREGATORS,
    ALLREDUCE_PROTOCOL_ID,
    MATCHMAKING_PROTOCOL_ID,
    Aggregator,
    AllReduceConfig,
    CodecPolicy,
    Layout,
    MatchmakingConfig,
)
from p2pdl.averaging.allreduce import _evidence as ar_evidence
from p2pdl.averaging.allreduce import _messages as ar_messages
from p2pdl.averaging.allreduce import _parts as ar_parts
from p2pdl.averaging.allreduce import _state as ar_state
from p2pdl.averaging.allreduce import config as ar_config
from p2pdl.averaging.matchmaking import _messages as mm_messages
from p2pdl.averaging.matchmaking import _plan as mm_plan
from p2pdl.averaging.matchmaking import _service as mm_service
from p2pdl.averaging.matchmaking import _state as mm_state
from p2pdl.averaging.matchmaking import config as mm_config
from p2pdl.dht import DHT_PROTOCOL_ID, GROUP_PREFIX, DHTConfig, GroupMember, RoutingTable
from p2pdl.dht import _messages as dht_messages
from p2pdl.dht import config as dht_config
from p2pdl.dht._relays import (
    MAX_RELAY_CANDIDATES,
    MAX_RELAYS_HANDED,
    RELAY_RETRY,
    RELAYS_GROUP,
)
from p2pdl.dht._service import (
    MAINTENANCE_TICK,
    MAX_BACKGROUND_SENDS,
    MIN_BOOTSTRAP_SPACING,
    REPUBLISH_CONCURRENCY,
)
from p2pdl.dht._validation import SIGNATURE_DOMAIN, signing_payload
from p2pdl.membership import MEMBERSHIP_PROTOCOL_ID, MembershipConfig
from p2pdl.membership import _certificates as mb_certificates
from p2pdl.membership import _messages as mb_messages
from p2pdl.membership import _service as mb_service
from p2pdl.membership import config as mb_config
from p2pdl.nat import DIALBACK_PROTOCOL_ID, NatConfig
from p2pdl.nat._messages import MAX_DIALBACK_ADDRS
from p2pdl.net import HostConfig, RelayLimits
from p2pdl.net._dialer import MAX_RELAY_ROUTES
from p2pdl.net._relay import REFRESH_AT
from p2pdl.progress import PROGRESS_PROTOCOL_ID, SNAPSHOT_PREFIX, ProgressConfig
from p2pdl.progress import _messages as progress_messages
from p2pdl.progress import config as progress_config
from p2pdl.progress._gossip import MAX_PUSH_BACKOFF
from p2pdl.progress._service import ALONE_READ_INTERVAL
from p2pdl.statesync import STATESYNC_PROTOCOL_ID, StateSyncConfig
from p2pdl.statesync import _downloads as ss_downloads
from p2pdl.statesync import _messages as ss_messages
from p2pdl.statesync import _state as ss_state
from p2pdl.statesync import config as ss_config
from p2pdl.wire import PING_PROTOCOL_ID, WireConfig
from p2pdl.wire._ping import MAX_PING_PAYLOAD

SPECS = pathlib.Path(__file__).resolve().parents[1] / "protocols"

#: Protocol ids defined in the code, by spec file.
CODE_IDS = {"ping.md": PING_PROTOCOL_ID, "transport.md": DIALBACK_PROTOCOL_ID,
            "dht.md": DHT_PROTOCOL_ID, "progress.md": PROGRESS_PROTOCOL_ID,
            "matchmaking.md": MATCHMAKING_PROTOCOL_ID, "allreduce.md": ALLREDUCE_PROTOCOL_ID,
            "statesync.md": STATESYNC_PROTOCOL_ID, "membership.md": MEMBERSHIP_PROTOCOL_ID}


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


def section(text: str, title: str) -> str:
    """The text of the ``## title`` section of a spec."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def number(value: str) -> float:
    return float(re.match(r"[0-9.]+", value).group())


def test_every_spec_states_its_protocol_id_literally():
    for path in sorted(SPECS.glob("*.md")):
        if path.name in ("README.md", "wire.md"):
            continue
        ids = re.findall(r"The protocol ID is `([^`]+)`", path.read_text())
        assert ids == [CODE_IDS[path.name]], path.name


def test_every_protocol_id_in_the_code_has_a_spec():
    ids_in_code = {v for module in (wire, nat, dht, progress, averaging, statesync, membership)
                   for k, v in vars(module).items()
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
    host, relay, reach = HostConfig(), RelayLimits(), NatConfig()
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


def test_dht_definitions_match_the_code():
    text = spec("dht.md")
    rows = definitions(text)
    # Every hard limit: the upper-case integer constants of the config and the messages.
    limits = {name: value for module in (dht_config, dht_messages)
              for name, value in vars(module).items()
              if name.isupper() and type(value) is int and name != "KiB"}
    assert {"MAX_KEY_LENGTH", "MAX_STORE_ITEMS", "STORE_BATCH_BYTES", "MAX_RECORD_SIZE",
            "TARGET_SIZE", "MAX_PEER_ID_SIZE", "MAX_RESULT_LENGTH"} <= limits.keys()
    for name, value in limits.items():
        assert number(rows[name]) == value, name
    assert number(rows["KEY_BITS"]) == dht.KEY_BITS
    # Every DHTConfig default: the numbers in the table, the mode and the backoff in words.
    defaults = DHTConfig()
    numeric = [f.name for f in dataclasses.fields(DHTConfig)
               if type(getattr(defaults, f.name)) in (int, float)]
    assert {"k", "alpha", "replication", "max_ttl"} <= set(numeric)
    for field in numeric:
        assert number(rows[field]) == getattr(defaults, field), field
    assert rows["mode"] == f"`{defaults.mode}`"
    backoff = defaults.bootstrap_backoff
    assert backoff.multiplier == 2
    assert f"{backoff.initial:g} s doubling to {backoff.maximum:g} s" in text
    assert f"[{1 - backoff.jitter:g}, {1 + backoff.jitter:g}]" in text
    assert number(rows["MAINTENANCE_TICK"]) == MAINTENANCE_TICK
    assert number(rows["MIN_BOOTSTRAP_SPACING"]) == MIN_BOOTSTRAP_SPACING
    assert number(rows["REPUBLISH_CONCURRENCY"]) == REPUBLISH_CONCURRENCY
    assert number(rows["MAX_BACKGROUND_SENDS"]) == MAX_BACKGROUND_SENDS
    assert rows["RELAYS_GROUP"] == f"`{RELAYS_GROUP}`"
    assert rows["relay_directory"] == str(defaults.relay_directory).lower()
    for name, value in (("MAX_RELAY_CANDIDATES", MAX_RELAY_CANDIDATES),
                        ("MAX_RELAYS_HANDED", MAX_RELAYS_HANDED), ("RELAY_RETRY", RELAY_RETRY)):
        assert number(rows[name]) == value, name
    table = inspect.signature(RoutingTable).parameters
    for field in ("replacement_cache", "max_failures"):
        assert number(rows[field]) == table[field].default, field
    assert number(rows["refresh_interval"]) == table["refresh_interval"].default


def test_dht_records_match_the_code():
    text = spec("dht.md")
    assert f'SIGNATURE_DOMAIN = "{SIGNATURE_DOMAIN}"' in text
    assert signing_payload("k", "@x", b"\x01", 1).hex() in text
    assert f"`{GROUP_PREFIX}`" in text
    # The merge rule is quoted from the module that implements it.
    rule = dht._records.__doc__.split("\n\n", 1)[1].strip()
    assert " ".join(rule.split()) in " ".join(section(text, "Records").split())


def test_dht_messages_match_the_code():
    messages = section(spec("dht.md"), "Messages")
    protocol = dht.DHT_PROTOCOL
    for message in (*protocol.requests, *protocol.responses):
        if message.TAG == "error":
            continue  # wire.md's error reply
        assert f"| `{message.TAG}` |" in messages, message.TAG
        for field in dataclasses.fields(message):
            assert f"| `{field.name}` |" in messages, (message.TAG, field.name)
    for nested in (dht_messages.PeerEntry, dht_messages.WireItem, GroupMember):
        text = messages if nested is not GroupMember else spec("dht.md")
        assert f"`{nested.TAG}`" in text, nested.TAG
        for field in dataclasses.fields(nested):
            assert f"| `{field.name}` |" in text, (nested.TAG, field.name)


#: Every reason a store result (``dht.stored``) can give: the Validator's
#: (``InvalidRecord``), the RecordStore's own and a DHT client's.  The test
#: below checks this list against the code, and the spec against this list.
STORE_REASONS = {"older", "full", "expired", "too_far_ahead", "too_large", "bad_value",
                 "bad_signature", "bad_owner", "bad_key", "bad_subkey", "schema", "unavailable"}


def test_dht_store_reasons_and_error_codes_match_the_code():
    code = pathlib.Path(dht.__file__).parent
    validation = set(re.findall(r'InvalidRecord\(\s*"(\w+)"',
                                (code / "_validation.py").read_text()))
    store = set(re.findall(r'return \(?f?"(\w+): ', (code / "_records.py").read_text()))
    service = (code / "_state.py").read_text()   # what a node answers
    client = set(re.findall(r'Stored\(\[f?"(\w+): ', service))
    assert store == {"older", "full"} and client == {"unavailable"}
    assert validation | store | client == STORE_REASONS
    errors = section(spec("dht.md"), "Errors")
    assert set(re.findall(r"^\| `(\w+)` \|", errors, re.MULTILINE)) == STORE_REASONS
    request_errors = set(re.findall(r'RequestError\(\s*"(\w+)"', service))
    assert request_errors == {"bad_request"}
    for error in request_errors:
        assert error in wire.ERROR_CODES and f"`{error}`" in errors, error


def test_progress_definitions_match_the_code():
    rows = definitions(spec("progress.md"))
    limits = {name: value for name, value in vars(progress_config).items()
              if name.isupper() and type(value) is int}
    assert {"MAX_RUN_ID_LENGTH", "MAX_REPORTS", "MAX_DIGEST", "MAX_COUNT"} <= limits.keys()
    for name, value in limits.items():
        assert number(rows[name]) == value, name
    assert number(rows["MAX_PUSH_BACKOFF"]) == MAX_PUSH_BACKOFF
    assert number(rows["ALONE_READ_INTERVAL"]) == ALONE_READ_INTERVAL
    defaults = ProgressConfig()
    for field in dataclasses.fields(ProgressConfig):
        assert number(rows[field.name]) == getattr(defaults, field.name), field.name


def test_progress_messages_and_signatures_match_the_code():
    text = spec("progress.md")
    messages = section(text, "Messages")
    protocol = progress.PROGRESS_PROTOCOL
    for message in (*protocol.requests, *protocol.responses):
        if message.TAG == "error":
            continue
        assert f"| `{message.TAG}` |" in messages, message.TAG
        for field in dataclasses.fields(message):
            assert f"| `{field.name}` |" in messages, (message.TAG, field.name)
    for nested in (progress_messages.Report, progress_messages.ReportInfo,
                   progress_messages.DigestEntry, progress_messages.SnapshotEntry):
        assert f"`{nested.TAG}`" in messages, nested.TAG
        for field in dataclasses.fields(nested):
            assert f"| `{field.name}` |" in messages, (nested.TAG, field.name)
    assert f'SIGNATURE_DOMAIN = "{progress_messages.SIGNATURE_DOMAIN}"' in text
    assert f'SIGNATURE_DOMAIN_INFO = "{progress_messages.SIGNATURE_DOMAIN_INFO}"' in text
    assert f"`{progress_messages.PATH_KINDS[0]}`" in messages
    for kind in progress_messages.PATH_KINDS:
        assert f"`{kind}`" in messages, kind
    example = progress_messages.signing_payload("demo", b"\x00\x24", 3, 640, 12.5,
                                                1700000000.25, False, False)
    assert example.hex() in text
    assert f"`{SNAPSHOT_PREFIX}<run id>`" in text


def test_matchmaking_definitions_match_the_code():
    rows = definitions(spec("matchmaking.md"))
    # Every hard limit of averaging/matchmaking/config.py that the matchmaking modules use.
    used = vars(mm_messages).keys() | vars(mm_plan).keys() | vars(mm_state).keys() \
        | vars(mm_service).keys()
    limits = {name: value for name, value in vars(mm_config).items()
              if name.isupper() and type(value) is int and name in used}
    assert {"MAX_RUN_ID_LENGTH", "MAX_EPOCH", "MAX_GROUP_SIZE", "GROUP_ID_SIZE",
            "MAX_JOIN_WAIT", "MAX_MATCHMAKING_TIME", "MIN_RATE", "MAX_RATE"} <= limits.keys()
    for name, value in limits.items():
        assert number(rows[name]) == value, name
    defaults = MatchmakingConfig()
    for field in dataclasses.fields(MatchmakingConfig):
        assert number(rows[field.name]) == getattr(defaults, field.name), field.name
    for name in ("REPLY_MARGIN", "JOIN_SLACK", "MAX_RECENT_ROUNDS", "GATHER_FRACTION",
                 "JOIN_WINDOW_FRACTION", "INTRODUCE_WAIT", "UNRESPONSIVE_TTL",
                 "MAX_UNRESPONSIVE"):
        assert abs(number(rows[name]) - getattr(mm_service, name)) < 1e-3, name
    assert number(rows["FRACTION_TOLERANCE"]) == mm_plan.FRACTION_TOLERANCE


def test_matchmaking_messages_codes_and_hashes_match_the_code():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    text = spec("matchmaking.md")
    messages = section(text, "Messages")
    protocol = mm_messages.MATCHMAKING_PROTOCOL
    for message in (*protocol.requests, *protocol.responses, mm_messages.MemberEntry):
        if message.TAG == "error":
            continue
        assert f"`{message.TAG}`" in messages, message.TAG
        for field in dataclasses.fields(message):
            assert f"| `{field.name}` |" in messages, (message.TAG, field.name)
    errors = section(text, "Errors")
    assert set(re.findall(r"^\| `(\w+)` \|", errors, re.MULTILINE)) == \
        set(mm_messages.REJECT_CODES)
    assert f'ORDER_DOMAIN = "{averaging.ORDER_DOMAIN}"' in text
    assert f'GROUP_ID_DOMAIN = "{averaging.GROUP_ID_DOMAIN}"' in text
    # The worked example: three peers from fixed keys, B in client mode, C auxiliary.
    a, b, c = (ID.from_pubkey(create_new_key_pair(bytes([i]) * 32).public_key)
               for i in (1, 2, 3))
    for peer in (a, b, c):
        assert f"`{peer}` | `{averaging.order_key('my-run', 3, peer).hex()}`" in text
    view = [averaging.GroupMemberInfo(a), averaging.GroupMemberInfo(b, True),
            averaging.GroupMemberInfo(c, auxiliary=True)]
    plan = averaging.plan_groups("my-run", 3, view, 4)
    assert plan.groups[0].members == tuple(view)
    fractions = (0.75, 0.0, 0.25)
    assert mm_plan.check_fractions(view, fractions) is None
    assert "`[0.75, 0.0, 0.25]`" in text
    preimage = msgpack.packb([averaging.GROUP_ID_DOMAIN, "my-run", 3,
                              [[m.peer_id.to_bytes(), m.client_mode, m.auxiliary] for m in view],
                              list(fractions)], use_bin_type=True)
    assert f"`{preimage.hex()}`" in text
    group_id = averaging.compute_group_id("my-run", 3, view, fractions)
    assert group_id == hashlib.sha256(preimage).digest()
    assert f"`{group_id.hex()}`" in text
    assert f"`{averaging.compute_group_id('my-run', 3, view).hex()}`" in text  # nil fractions
    assert f"`{GROUP_PREFIX}{averaging.round_key('R', 'E')}`" in text  # the rendezvous key



def test_allreduce_definitions_match_the_code():
    rows = definitions(spec("allreduce.md"))
    for name in ("MAX_WEIGHT", "LAYOUT_DIGEST_SIZE", "MAX_SEGMENTS"):
        assert number(rows[name]) == getattr(ar_messages, name), name
    for name in ("MIN_CHUNK_VALUES", "MAX_CHUNK_VALUES", "MAX_AVERAGING_TIMEOUT",
                 "MAX_CHUNKS_AHEAD"):
        assert number(rows[name]) == getattr(ar_config, name), name
    assert number(rows["LAYOUT_VERSION"]) == ar_state.LAYOUT_VERSION
    assert number(rows["MIN_CAPPED_CONTRIBUTORS"]) == ar_state.MIN_CAPPED_CONTRIBUTORS
    assert number(rows["MIN_OUTLIER_VALUES"]) == ar_parts.MIN_OUTLIER_VALUES
    from p2pdl.averaging.allreduce import _verify as ar_verify
    for name in ("SKETCH_BUCKETS", "NORM_SLACK", "NONCE_SIZE", "TAU_SLACK", "RESIDUAL_SLACK",
                 "FLOAT32_ULPS"):
        assert number(rows[name]) == getattr(ar_verify, name), name
    assert number(rows["RESULT_DIGEST_SIZE"]) == ar_messages.RESULT_DIGEST_SIZE
    assert float(rows["MAX_TAU"].split()[0]) == ar_messages.MAX_TAU
    from p2pdl.averaging._aggregators import AUTO_TAU_FACTOR
    assert number(rows["AUTO_TAU_FACTOR"]) == AUTO_TAU_FACTOR
    from p2pdl.averaging.allreduce import _evidence as ar_evidence
    for name in ("CHUNK_DIGEST_SIZE", "SIGNATURE_SIZE", "MAX_COMMITTED_CHUNKS"):
        assert number(rows[name]) == getattr(ar_evidence, name), name
    assert number(rows["REPORT_TOLERANCE"]) == ar_verify.REPORT_TOLERANCE
    assert number(rows["MAX_EVIDENCE_ROUNDS"]) == ar_config.MAX_EVIDENCE_ROUNDS
    from p2pdl.averaging.allreduce import _session as ar_session
    for name in ("DONE_LINGER", "MAX_RECENT_GROUPS", "LIVENESS_POLL", "HAVE_GRACE", "JOIN_WAIT"):
        assert number(rows[name]) == getattr(ar_session, name), name
    from p2pdl.averaging.allreduce import _accusations as ar_accusations
    from p2pdl.averaging.allreduce import _accusing as ar_accusing
    for name in ("MAX_ACCUSATIONS", "MAX_CHECKED_ACCUSATIONS", "MAX_WATCHED_RUNS",
                 "MAX_FETCH_TRIES"):
        assert number(rows[name]) == getattr(ar_accusations, name), name
    for name in ("COMMITTED_DIGEST_SIZE", "PROOF_DIGEST_SIZE", "MAX_LAYOUT_PREIMAGE"):
        assert number(rows[name]) == getattr(ar_messages, name), name
    from p2pdl.averaging.allreduce import _proofs as ar_proofs
    for name in ("MAX_KEPT_PROOFS", "MAX_KEPT_PROOF_BYTES", "MAX_PROOF_VALUES"):
        assert number(rows[name]) == getattr(ar_proofs, name), name
    assert number(rows["ACCUSATION_TTL"]) == ar_accusing.ACCUSATION_TTL
    assert rows["ACCUSATIONS_PREFIX"].strip("`") == ar_accusations.ACCUSATIONS_PREFIX
    defaults = AllReduceConfig()
    for field in dataclasses.fields(AllReduceConfig):
        if field.name == "codecs":
            assert defaults.codecs == CodecPolicy("none", "fp16", 65536)
            assert "65536" in rows["codecs"] and "fp16" in rows["codecs"]
            continue
        if field.name == "aggregator":
            rule = defaults.aggregator
            assert rule.name == "centered_clip" and rule.tau == "auto"
            assert rows["aggregator"].startswith("centered_clip with tau auto")
            for name in ("iterations", "tolerance"):
                found = re.search(rf"{name} ([0-9.e-]+)", rows["aggregator"])
                assert found and float(found.group(1)) == getattr(rule, name), name
            continue
        if field.name == "verify":
            assert rows["verify"].startswith(str(defaults.verify).lower())
            continue
        assert number(rows[field.name]) == getattr(defaults, field.name), field.name


def test_allreduce_messages_codes_and_layout_match_the_code():
    from p2pdl.averaging.allreduce import _accusations as ar_accusations
    text = spec("allreduce.md")
    messages = section(text, "Messages")
    for message in (ar_messages.Begin, ar_messages.Done, ar_messages.Reject,
                    ar_messages.Segment, ar_messages.Have, ar_messages.Reveal,
                    ar_messages.Joint, ar_messages.Check,
                    ar_messages.PartCheck, ar_messages.Dispute, ar_messages.SignedReport,
                    ar_messages.Proof, ar_messages.Shown, ar_accusations.Equivocation,
                    ar_accusations.Accusations, ar_messages.Committed, ar_messages.FetchProof,
                    ar_messages.ProvenDispute, ar_accusations.DisputeClaim):
        assert f"`{message.TAG}`" in messages, message.TAG
        for field in dataclasses.fields(message):
            assert f"| `{field.name}` |" in messages, (message.TAG, field.name)
    errors = section(text, "Errors")
    assert set(re.findall(r"^\| `(\w+)` \|", errors, re.MULTILINE)) == \
        set(ar_messages.REJECT_CODES)
    # The worked example of the layout digest.
    layout = Layout.for_tensors([3, 70000], [0.75, 0.0, 0.25], CodecPolicy(), 1024)
    preimage = msgpack.packb([ar_state.LAYOUT_VERSION, [3, 70000],
                              [["none", None], ["fp16", None]], [0.75, 0.0, 0.25], 1024])
    assert f"`{preimage.hex()}`" in text
    assert hashlib.sha256(preimage).digest() == layout.digest
    assert f"`{layout.digest.hex()}`" in text
    assert layout.part_bounds == ((0, 52502), (52502, 52502), (52502, 70003))
    assert len(layout.chunks[0]) == 53 and layout.chunks[0][0].count == 3
    # Chunk and result digests are BLAKE3 (32 bytes), the layout's SHA-256.
    assert ar_evidence.chunk_digest(preimage) == blake3.blake3(preimage).digest()
    assert ar_evidence.payload_hasher().update(preimage).digest() == \
        blake3.blake3(preimage).digest()
    for row in ("CHUNK_DIGEST_SIZE", "RESULT_DIGEST_SIZE"):
        assert "BLAKE3" in text.split(f"| {row} |", 1)[1].split("\n", 1)[0]
    # A robust rule adds its description; the mean adds nothing.
    clip = Aggregator("centered_clip", tau=0.5)
    robust = Layout.for_tensors([3, 70000], [0.75, 0.0, 0.25], CodecPolicy(), 1024, clip)
    assert robust.digest == hashlib.sha256(msgpack.packb(
        [*msgpack.unpackb(preimage), ["centered_clip", 0.5, 100, 1e-6]])).digest()
    # The aggregation digest matchmaking compares, in the spec's domain.
    config = AllReduceConfig(aggregator=clip)
    share, ratio = config.caps
    assert '"p2pdl/aggregator/4"' in text
    assert config.aggregation_digest() == hashlib.sha256(msgpack.packb(
        ["p2pdl/aggregator/4", clip.describe(), ["caps", share, ratio]])).digest()
    for rule in ('["centered_clip", tau, iterations, tolerance]', '["trimmed_mean", trim]',
                 '["median"]'):
        assert rule in text
    aggregation = text.split("\n### Aggregation\n", 1)[1].split("\n## ", 1)[0]
    for name in AGGREGATORS:
        assert f"| `{name}` |" in aggregation, name


def test_statesync_definitions_match_the_code():
    rows = definitions(spec("statesync.md"))
    limits = {name: value for name, value in vars(ss_config).items()
              if name.isupper() and type(value) is int and name not in ("KiB", "MiB", "GiB")}
    assert {"MAX_RUN_ID_LENGTH", "MAX_EPOCH", "DIGEST_SIZE", "MIN_CHUNK_SIZE", "MAX_CHUNK_SIZE",
            "MAX_CHUNKS", "MESSAGE_OVERHEAD"} <= limits.keys()
    for name, value in limits.items():
        assert number(rows[name]) == value, name
    assert number(rows["MAX_BUSY_BACKOFF"]) == ss_downloads.MAX_BUSY_BACKOFF
    defaults = StateSyncConfig()
    for field in dataclasses.fields(StateSyncConfig):
        assert number(rows[field.name]) == getattr(defaults, field.name), field.name
    # The manifest of the largest payload and the largest chunk fit the default wire.
    limit = WireConfig().max_message_size
    assert ss_config.MAX_CHUNKS * ss_config.DIGEST_SIZE + ss_config.MESSAGE_OVERHEAD <= limit
    assert ss_config.MAX_CHUNK_SIZE + ss_config.MESSAGE_OVERHEAD <= limit


def test_statesync_messages_codes_and_example_match_the_code():
    text = spec("statesync.md")
    messages = section(text, "Messages")
    protocol = ss_messages.STATESYNC_PROTOCOL
    for message in (*protocol.requests, *protocol.responses):
        if message.TAG == "error":
            continue
        assert f"| `{message.TAG}` |" in messages, message.TAG
        for field in dataclasses.fields(message):
            assert f"| `{field.name}` |" in messages, (message.TAG, field.name)
    errors = section(text, "Errors")
    assert set(re.findall(r"^\| `(\w+)` \|", errors, re.MULTILINE)) == \
        set(ss_messages.REFUSAL_CODES)
    # The worked example: a manifest and a chunk request.
    payload = bytes(range(256)) * 20
    manifest = ss_state.Manifest.build(3, payload, 4096)
    assert manifest.num_chunks == 2 and manifest.digest == hashlib.sha256(payload).digest()
    assert f"`{manifest.digest.hex()}`" in messages
    assert f"`{manifest.chunk_digests[:32].hex()}`" in messages
    assert f"`{manifest.chunk_digests[32:].hex()}`" in messages
    request = wire.encode_message(ss_messages.GetChunk("demo", manifest.digest, 1), 7)
    assert f"`{request.hex()}`" in messages


def test_membership_definitions_match_the_code():
    rows = definitions(spec("membership.md"))
    limits = {name: value for name, value in vars(mb_config).items()
              if name.isupper() and type(value) in (int, float)}
    assert {"MAX_CERTIFICATE_SIZE", "MAX_REVOCATION_LIST_SIZE", "MAX_REVOKED_SERIALS",
            "MAX_SERIAL", "DEFAULT_CERTIFICATE_LIFETIME"} <= limits.keys()
    for name, value in limits.items():
        written = int(re.match(r"[0-9]+", rows[name]).group()) if type(value) is int \
            else number(rows[name])
        assert written == value, name
    assert number(rows["FIRST_REFRESH_DELAY"]) == mb_service.FIRST_REFRESH_DELAY
    defaults = MembershipConfig()
    for field in dataclasses.fields(MembershipConfig):
        assert number(rows[field.name]) == getattr(defaults, field.name), field.name


def test_membership_messages_and_encodings_match_the_code():
    text = spec("membership.md")
    messages = section(text, "Messages")
    protocol = mb_messages.MEMBERSHIP_PROTOCOL
    for message in (*protocol.requests, *protocol.responses):
        if message.TAG == "error":
            continue
        assert f"| `{message.TAG}` |" in messages, message.TAG
        for field in dataclasses.fields(message):
            assert f"| `{field.name}` |" in messages, (message.TAG, field.name)
    assert f'CERTIFICATE_DOMAIN = "{mb_certificates.CERTIFICATE_DOMAIN}"' in text
    assert f'REVOCATION_DOMAIN = "{mb_certificates.REVOCATION_DOMAIN}"' in text
    assert f"`{mb_certificates.CERTIFICATE_HEADER}`" in text
    assert f"`{mb_certificates.REVOCATION_HEADER}`" in text
    assert f"`{mb_config.REVOCATION_PREFIX}<run id>`" in text
    # The encodings' field order, as the code writes them.
    authority = membership.Authority.generate()
    cert = authority.issue("r", authority.id, "trainer", now=1.0, serial=5)
    fields = msgpack.unpackb(cert.to_bytes())
    assert fields[0] == mb_certificates.FORMAT_VERSION and fields[1:8] == \
        ["r", authority.id, "trainer", 1.0, cert.expires_at, 5, authority.id]
    payload = msgpack.unpackb(cert.signing_payload())
    assert payload == [mb_certificates.CERTIFICATE_DOMAIN, 1, *fields[1:8]]
    rl = authority.revocation_list("r", [9, 3], sequence=2, now=1.0)
    assert msgpack.unpackb(rl.to_bytes())[:6] == [1, "r", authority.id, 2, 1.0, [3, 9]]
    assert msgpack.unpackb(rl.signing_payload()) == \
        [mb_certificates.REVOCATION_DOMAIN, 1, "r", authority.id, 2, 1.0, [3, 9]]
