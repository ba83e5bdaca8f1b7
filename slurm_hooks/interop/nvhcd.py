"""NVIDIA Resiliency Extension's node-health contract: ``nvhcd.HealthCheckService/RunHealthCheck``
over a Unix socket, served here, and asked by ``slurm-hooks validate``.

The contract, as NVRx publishes it (``shared_utils/proto/nvhcd.proto``, package ``nvhcd``)::

    service HealthCheckService { rpc RunHealthCheck(HealthCheckRequest) returns (HealthCheckResponse); }
    message HealthCheckRequest  { repeated string args = 1; }
    message HealthCheckResponse { bool success = 1; int32 exit_code = 2; string output = 3; string error = 4; }

How NVRx's client (``shared_utils/health_check.py``, ``NodeHealthCheck``, called by
``ft_launcher`` before each rendezvous when ``--ft-node-health-check-endpoint`` names a socket)
reads an answer: ``success`` false is unhealthy; otherwise ``output`` is JSON whose
``fail_count`` must be 0 (absent, or not JSON: unhealthy) and whose ``failed_checks`` it logs. It
asks with a 60 s deadline and the args ``--no-slurm --group prolog epilog logs gpu``. A socket
path that does not exist skips the check; a gRPC error (nothing answers, the deadline passed) is
logged and counted healthy. An unhealthy answer makes the launcher leave the rendezvous and exit 1.

The messages are built here from that contract with protobuf's runtime (a hand-written descriptor
in a pool of our own, so NVRx's generated classes in the same process never clash with ours);
the service is a generic gRPC handler. grpcio and protobuf are the ``nvrx`` extra, imported on
first use: :func:`require` says in one line what is missing.
"""

from __future__ import annotations

import json
import os
import socket
import stat

from slurm_hooks.errors import PermanentError, TransientError
from slurm_hooks.values import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

PACKAGE = "nvhcd"
SERVICE = f"{PACKAGE}.HealthCheckService"
METHOD = "RunHealthCheck"
#: The method's gRPC path.
RPC = f"/{SERVICE}/{METHOD}"
#: The deadline NVRx's client asks with (``NodeHealthCheck.request_timeout_sec``).
NVRX_DEADLINE_S = 60.0
#: The socket's mode: its owner (the watcher) and its group (the users whose jobs may ask).
SOCKET_MODE = 0o660
#: Answers computed at once; beyond that gRPC answers RESOURCE_EXHAUSTED, which NVRx counts healthy.
MAX_CONCURRENT = 32
WORKERS = 4
INSTALL_HINT = "pip install 'slurm-hooks[nvrx]'"


class Unavailable(PermanentError):
    """grpcio or protobuf is not installed: the contract cannot be spoken."""


def require() -> tuple[Any, type, type]:
    """``(grpc, HealthCheckRequest, HealthCheckResponse)``; raises :class:`Unavailable`."""
    try:
        import grpc
    except ImportError as exc:
        raise Unavailable(f"grpcio is not installed ({INSTALL_HINT}): {exc}") from None
    request, response = messages()
    return grpc, request, response


_MESSAGES: list[tuple[type, type]] = []


def messages() -> tuple[type, type]:
    """The two message classes, built once from the contract; raises :class:`Unavailable`."""
    if not _MESSAGES:
        try:
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        except ImportError as exc:
            raise Unavailable(f"protobuf is not installed ({INSTALL_HINT}): {exc}") from None
        f = descriptor_pb2.FieldDescriptorProto
        proto = descriptor_pb2.FileDescriptorProto(name="slurm_hooks/interop/nvhcd.proto", package=PACKAGE,
                                                   syntax="proto3")
        req = proto.message_type.add(name="HealthCheckRequest")
        req.field.add(name="args", number=1, type=f.TYPE_STRING, label=f.LABEL_REPEATED, json_name="args")
        resp = proto.message_type.add(name="HealthCheckResponse")
        for number, (name, kind, json_name) in enumerate((("success", f.TYPE_BOOL, "success"),
                                                          ("exit_code", f.TYPE_INT32, "exitCode"),
                                                          ("output", f.TYPE_STRING, "output"),
                                                          ("error", f.TYPE_STRING, "error")), start=1):
            resp.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL, json_name=json_name)
        service = proto.service.add(name="HealthCheckService")
        service.method.add(name=METHOD, input_type=f".{PACKAGE}.HealthCheckRequest",
                           output_type=f".{PACKAGE}.HealthCheckResponse")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto)
        classes = []
        for name in ("HealthCheckRequest", "HealthCheckResponse"):
            desc = pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
            make = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
            classes.append(make(desc) if make else message_factory.MessageFactory(pool).GetPrototype(desc))
        _MESSAGES.append((classes[0], classes[1]))
    return _MESSAGES[0]


@dataclass(frozen=True)
class Answer:
    """One answer to ``RunHealthCheck``: our verdict in the words NVRx reads."""

    healthy: bool
    #: Our reason's words (``slurm-hooks: XID 79 on GPU 3 [reboot]``), or why the node is fit.
    message: str
    #: What failed, one line each (NVRx logs them); empty when healthy.
    failed_checks: tuple[str, ...] = ()
    #: More of the answer, kept in the JSON ``output`` (node, scope, the verdict's age and source).
    details: dict = field(default_factory=dict)

    @property
    def fail_count(self) -> int:
        return 0 if self.healthy else max(1, len(self.failed_checks))

    def output(self) -> str:
        body = {**self.details, "healthy": self.healthy, "message": self.message, "fail_count": self.fail_count,
                "failed_checks": list(self.failed_checks)}
        return json.dumps(body, sort_keys=True)

    def response_fields(self) -> dict[str, Any]:
        """The response's fields: ``success`` and ``fail_count`` say the same, so that a client reading
        either refuses an unhealthy node; ``error`` carries our reason when it is unhealthy."""
        return {"success": self.healthy, "exit_code": 0 if self.healthy else 1, "output": self.output(),
                "error": "" if self.healthy else self.message}

    @classmethod
    def read(cls, success: bool, exit_code: int, output: str, error: str) -> Answer:
        """A response as NVRx's client judges it (not success, or a ``fail_count`` other than 0,
        absent or unreadable: unhealthy)."""
        try:
            body = json.loads(output)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return cls(False, error or f"exit code {exit_code}, output not JSON: {output[:200]!r}")
        checks = tuple(str(c) for c in body.get("failed_checks") or ())
        healthy = bool(success) and body.get("fail_count") == 0
        details = {k: v for k, v in body.items() if k not in ("healthy", "message", "fail_count", "failed_checks")}
        return cls(healthy, str(body.get("message") or error or ""), checks, details)


class Server:
    """The running service on its socket; :meth:`stop` ends it and removes the socket."""

    def __init__(self, server: Any, path: str):
        self._server, self.path = server, path
        st = os.stat(path)
        self._identity = (st.st_dev, st.st_ino)

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._identity:  # ours still: not a later watcher's
                os.unlink(self.path)
        except OSError:
            pass


def serve(path: str, answer: Callable[[list[str], float | None], Answer], group: str = "",
          on_error: Callable[[str], None] | None = None) -> Server:
    """Serve ``RunHealthCheck`` on the Unix socket ``path`` (mode 0660, group ``group``; "" keeps
    the process's own), each request answered by ``answer(args, seconds the asker still waits or
    None)``. An ``answer`` that raises is a gRPC INTERNAL error carrying its text (NVRx logs it and
    goes on), told to ``on_error``. Raises :class:`Unavailable`, or :class:`PermanentError` when
    the socket cannot be made (another server answers there, a file that is not a socket, a group
    that does not exist)."""
    grpc, request_cls, response_cls = require()
    gid = group_id(group) if group else None
    _clear(path)

    def run_health_check(request: Any, context: Any) -> Any:
        left = context.time_remaining()
        try:
            said = answer(list(request.args), left if left is not None and left < 1e9 else None)
        except Exception as exc:  # noqa: BLE001 - one bad answer must not end the service
            text = f"slurm-hooks could not answer: {type(exc).__name__}: {exc}"
            if on_error is not None:
                on_error(text)
            context.abort(grpc.StatusCode.INTERNAL, text)
        return response_cls(**said.response_fields())

    from concurrent.futures import ThreadPoolExecutor

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        METHOD: grpc.unary_unary_rpc_method_handler(run_health_check, request_deserializer=request_cls.FromString,
                                                    response_serializer=response_cls.SerializeToString)})
    server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="nvhcd"), handlers=(handler,),
                         maximum_concurrent_rpcs=MAX_CONCURRENT)
    try:
        bound = server.add_insecure_port(f"unix:{path}")
    except RuntimeError as exc:  # grpcio >= 1.49 raises where older ones returned 0
        raise PermanentError(f"{path}: cannot listen: {exc}") from None
    if not bound:
        raise PermanentError(f"{path}: cannot listen")
    try:
        # Made with the process's umask (0755 under systemd: only the owner may connect), then opened
        # to the group: never wider than asked, at any moment.
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        server.stop(None)
        raise PermanentError(f"{path}: cannot set its group and mode: {exc.strerror}") from None
    server.start()
    return Server(server, path)


def ask(path: str, args: Sequence[str] = (), timeout: float = 5.0) -> Answer:
    """Ask the service on ``path`` as NVRx does; raises :class:`Unavailable`, or :class:`TransientError`
    when nothing answers there (no socket, refused, the deadline passed)."""
    grpc, request_cls, response_cls = require()
    if not os.path.exists(path):
        raise TransientError(f"{path}: no such socket")
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(RPC, request_serializer=request_cls.SerializeToString,
                                   response_deserializer=response_cls.FromString)
        try:
            resp = call(request_cls(args=list(args)), timeout=timeout)
        except grpc.RpcError as exc:
            raise TransientError(f"{path}: {exc.code().name}: {exc.details()}") from None
    return Answer.read(resp.success, resp.exit_code, resp.output, resp.error)


def group_id(group: str) -> int:
    """A group's id from its name (or its number); raises :class:`PermanentError` for no such group."""
    if group.isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise PermanentError(f"group {group!r} does not exist") from None


def _clear(path: str) -> None:
    """Make room for the socket: its directory made (0755), a socket a dead server left removed;
    never a file that is not a socket, nor a socket someone still answers on."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", mode=0o755, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise PermanentError(f"{path}: exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: left by a server that died
        return
    finally:
        probe.close()
    raise PermanentError(f"{path}: another server answers on this socket")
