"""The asking side of NVRx's node-health contract, as ``ft_launcher`` asks it: the real grpcio client
over the Unix socket, with the messages encoded and decoded here by hand from nvhcd.proto's field
numbers (independent of the descriptor slurm_hooks.interop.nvhcd builds, so that a mistake there
shows), and the answer judged as NVRx's ``NodeHealthCheck._perform_health_check`` judges it.

    message HealthCheckRequest  { repeated string args = 1; }
    message HealthCheckResponse { bool success = 1; int32 exit_code = 2; string output = 3; string error = 4; }
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: What ft_launcher sends (its ``_DEFAULT_NODE_HEALTH_CHECK_ARGS``).
NVRX_ARGS = ("--no-slurm", "--group", "prolog", "epilog", "logs", "gpu")
RPC = "/nvhcd.HealthCheckService/RunHealthCheck"


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_request(args) -> bytes:
    out = b""
    for a in args:
        data = a.encode()
        out += b"\x0a" + _varint(len(data)) + data  # field 1, wire type 2
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


@dataclass
class Response:
    success: bool = False
    exit_code: int = 0
    output: str = ""
    error: str = ""
    body: dict = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """As NVRx judges it: not success, or output whose fail_count is not 0 (or absent): unhealthy."""
        return self.success and self.body.get("fail_count") == 0


def decode_response(buf: bytes) -> Response:
    r = Response()
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
            if number == 1:
                r.success = bool(value)
            elif number == 2:
                r.exit_code = value - (1 << 64) if value >= 1 << 63 else value
        elif wire == 2:
            size, i = _read_varint(buf, i)
            text = buf[i:i + size].decode()
            i += size
            if number == 3:
                r.output = text
            elif number == 4:
                r.error = text
        else:
            raise AssertionError(f"unexpected wire type {wire} for field {number}")
    try:
        r.body = json.loads(r.output)
    except ValueError:
        r.body = {}
    return r


def ask(path: str, args=NVRX_ARGS, timeout: float = 60.0) -> Response:
    """One ``RunHealthCheck`` over ``unix://path`` as NVRx makes it (its target form, its 60 s)."""
    import grpc

    with grpc.insecure_channel(f"unix://{path}") as channel:
        call = channel.unary_unary(RPC, request_serializer=encode_request, response_deserializer=decode_response)
        return call(list(args), timeout=timeout)
