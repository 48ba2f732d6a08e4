"""What an outsider on the rehearsal's network can do: run inside a namespace with ``ip netns exec``.

    python -m feddg.rehearsal.probe ports ADDRESS [ADDRESS ...]      -> {"ADDRESS": [open ports], ...}
    python -m feddg.rehearsal.probe serves HOST PORT                 -> what the port answers without a certificate
    python -m feddg.rehearsal.probe handshake HOST PORT CA CERT KEY  -> "accepted" or the TLS error

Each prints one JSON document. ``ports`` tries every TCP port 1-65535 of each address once (a connection attempt
with a short timeout, many at a time); an address of the test network answers a closed port with a reset at once,
so the whole probe takes seconds. The callers pass only addresses of the rehearsal's own network.
"""

from __future__ import annotations

import errno
import json
import selectors
import socket
import ssl
import sys
import time

ALL_PORTS = range(1, 65536)
CONNECT_TIMEOUT = 1.0  # seconds per attempt: a reset comes back in microseconds on the bridge
CONCURRENCY = 512  # attempts in flight (file descriptors: well under the usual limit of 1024)
PROBE_BYTES = b"GET / HTTP/1.0\r\n\r\n"


def open_ports(addresses: list[str], ports: range = ALL_PORTS) -> dict[str, list[int]]:
    """The ports of each address that accept a TCP connection: non-blocking connection attempts, ``CONCURRENCY`` at
    a time, each given ``CONNECT_TIMEOUT`` s (so the probe is bounded even where nothing answers). Plain sockets and
    a selector rather than asyncio: a coroutine per port made the sweep of 65535 ports ~40x slower."""
    found: dict[str, list[int]] = {}
    for address in addresses:
        found[address] = []
        for start in range(0, len(ports), CONCURRENCY):
            found[address] += _open_batch(address, ports[start:start + CONCURRENCY])
    return found


def _open_batch(address: str, ports: range) -> list[int]:
    pending: dict[socket.socket, int] = {}
    is_open = []
    with selectors.DefaultSelector() as selector:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            code = s.connect_ex((address, port))
            if code == 0:
                is_open.append(port)
                s.close()
            elif code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                pending[s] = port
                selector.register(s, selectors.EVENT_WRITE)
            else:
                s.close()
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while pending and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                s = key.fileobj
                selector.unregister(s)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    is_open.append(pending[s])
                del pending[s]
                s.close()
        for s in pending:  # no answer within the timeout: not open
            selector.unregister(s)
            s.close()
    return sorted(is_open)


def serves(host: str, port: int, timeout: float = 5.0) -> dict[str, str]:
    """What ``port`` gives a client without a kit's certificate: to plain bytes (an HTTP request) and to a TLS
    handshake without a client certificate (the server's certificate is not checked: the point is whether the
    server lets the handshake finish). Each answer: "nothing" (no byte came back), "accepted", or what came back."""
    answers = {}
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(PROBE_BYTES)
            try:
                data = s.recv(256)
            except (TimeoutError, ConnectionResetError):
                data = b""
            answers["plain"] = "nothing" if not data else f"answered {data[:60]!r}"
    except OSError as e:
        answers["plain"] = f"{type(e).__name__}: {e}"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # the server's verdict on the client certificate is in the handshake
    answers["tls without a certificate"] = _handshake(ctx, host, port, timeout)
    return answers


def handshake(host: str, port: int, ca: str, cert: str, key: str, timeout: float = 20.0) -> str:
    """A TLS handshake with ``cert``/``key`` that checks the server's certificate against ``ca`` and its name:
    "accepted" or the error. TLS 1.2, so that the server's verdict on the client certificate is part of the handshake
    (TLS 1.3 sends it after the handshake; NVFlare's server accepts 1.2 and up). Nothing is sent afterwards."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return _handshake(ctx, host, port, timeout)


def _handshake(ctx: ssl.SSLContext, host: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=host):
                return "accepted"
    except (ssl.SSLError, OSError) as e:
        return f"{type(e).__name__}: {e}"[:200]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["ports"] and len(args) > 1:
        result: object = open_ports(args[1:])
    elif args[:1] == ["serves"] and len(args) == 3:
        result = serves(args[1], int(args[2]))
    elif args[:1] == ["handshake"] and len(args) == 6:
        result = handshake(args[1], int(args[2]), *args[3:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
