"""Small socket programs that the netlab tests run inside lab hosts.

Run as ``python _peer.py COMMAND ...``; each prints one JSON line (after
``ready`` for servers) and exits non-zero on failure.  Standard library only,
so each starts in a few tens of milliseconds.  Every command is bounded by
``--timeout`` (SIGALRM as the last resort).

    serve PORT [--count N]          answer each connection with the peer address it saw
    connect HOST PORT [--bind-port P]
    punch LOCAL_PORT HOST PORT      TCP simultaneous open from LOCAL_PORT
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys


def _listen(port: int) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    print("ready", flush=True)
    return server


def _report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def serve(args: argparse.Namespace) -> int:
    server = _listen(args.port)
    for _ in range(args.count):
        conn, (peer_ip, peer_port) = server.accept()
        with conn:
            conn.sendall(json.dumps({"ip": peer_ip, "port": peer_port}).encode() + b"\n")
            _report(ip=peer_ip, port=peer_port)
    return 0


def connect(args: argparse.Namespace) -> int:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if args.bind_port:
        sock.bind(("0.0.0.0", args.bind_port))
    sock.settimeout(args.timeout)
    try:
        sock.connect((args.host, args.port))
        seen = json.loads(sock.makefile().readline())
    except OSError as exc:
        _report(ok=False, error=type(exc).__name__, errno=exc.errno)
        return 1
    _report(ok=True, local_port=sock.getsockname()[1], seen=seen)
    return 0


def punch(args: argparse.Namespace) -> int:
    # Both peers run this at about the same time, each aiming at the other's
    # gateway and the port it expects the other's NAT to have kept.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", args.local_port))
    sock.settimeout(args.timeout)
    try:
        sock.connect((args.host, args.port))
        sock.sendall(b"hello\n")
        reply = sock.makefile("rb").readline()
    except OSError as exc:
        _report(ok=False, error=type(exc).__name__, errno=exc.errno)
        return 1
    _report(ok=reply == b"hello\n", peer=list(sock.getpeername()))
    return 0 if reply == b"hello\n" else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=10.0)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("port", type=int)
    p.add_argument("--count", type=int, default=1)
    p = sub.add_parser("connect")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--bind-port", type=int, default=0)
    p = sub.add_parser("punch")
    p.add_argument("local_port", type=int)
    p.add_argument("host")
    p.add_argument("port", type=int)
    args = parser.parse_args()
    signal.alarm(int(args.timeout) + 5)  # the last resort: never outlive a test
    handler = {"serve": serve, "connect": connect, "punch": punch}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
