"""A stand-in for perftest's ``ib_write_bw`` (GPU-direct, ``--report_gbits``): a server (no host
argument) listens on ``-p`` and waits for one client; a client connects to it and prints the
captured client output's format (tests/fixtures/perftest/ib_write_bw_use_cuda_client.txt) with
the HCA (``-d``) and the average the HCA gives, read from ``--state`` (JSON ``{"mlx5_0": 380.2,
...}``; a missing HCA fails as perftest does). A client with no server listening fails as
perftest's does ("Couldn't connect to ...").

    python perftest.py --state STATE.json [ib_write_bw's own arguments] [host]
"""

from __future__ import annotations

import json
import os
import socket
import sys

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "perftest",
                       "ib_write_bw_use_cuda_client.txt")


def main(argv: list[str]) -> int:
    state = json.load(open(argv[argv.index("--state") + 1]))
    args = [a for i, a in enumerate(argv) if a != "--state" and (i == 0 or argv[i - 1] != "--state")]
    device = args[args.index("-d") + 1]
    port = int(args[args.index("-p") + 1])
    positional = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in ("-d", "-p", "-D"))]
    if device not in state:
        print(f" Couldn't find device {device}\n Unable to find the Infiniband/RoCE device")
        return 1
    if not positional:  # the server: one client, then done
        with socket.socket() as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", port))
            srv.listen(1)
            srv.settimeout(30)
            conn, _ = srv.accept()
            conn.recv(16)
            conn.close()
        print("\n************************************\n* Waiting for client to connect... *\n"
              "************************************")
        return 0
    try:
        with socket.create_connection((positional[0], port), timeout=5) as c:
            c.sendall(b"hello")
    except OSError:
        print(f"Couldn't connect to {positional[0]}:{port}\nUnable to open file descriptor for socket connection "
              "Unable to init the socket connection")
        return 1
    text = open(FIXTURE).read().replace("Device         : mlx5_1", f"Device         : {device}")
    sys.stdout.write(text.replace("181.46", f"{float(state[device]):.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
