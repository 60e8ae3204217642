"""A second NCCL communicator driven through NCCL's C API, for timing small messages.

``torch.distributed`` spends a few microseconds of host time per collective (work objects,
stream events, the watchdog's queue). At 1 MiB on NVLink one all-reduce takes ~14 µs on
the GPU, so a loop of torch calls measures the host, not the fabric; CUDA-graph capture of
torch collectives keeps the cross-stream events and gains nothing. nccl-tests calls
``ncclAllReduce`` directly; this module does the same through ctypes, on the very NCCL
library torch has loaded (same version, same environment and NCCL profile), so
small-message figures compare with ``all_reduce_perf``.

Everything here is optional: if the library or a symbol is missing on any rank, every rank
agrees to skip it and the sweep times the torch path only.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

NCCL_FLOAT32 = 7  # ncclDataType_t ncclFloat32
NCCL_SUM = 0  # ncclRedOp_t ncclSum
_SYMBOLS = ("ncclGetUniqueId", "ncclCommInitRank", "ncclAllReduce", "ncclCommDestroy")


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES


def _load() -> ctypes.CDLL | None:
    """The NCCL library already in the process (torch loaded it), or None."""
    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        logger.info("direct NCCL timing unavailable: %s", e)
        return None
    missing = [s for s in _SYMBOLS if not hasattr(lib, s)]
    if missing:
        logger.info("direct NCCL timing unavailable: %s missing", ", ".join(missing))
        return None
    ptr, c_int = ctypes.c_void_p, ctypes.c_int
    # ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)
    lib.ncclAllReduce.argtypes = [ptr, ptr, ctypes.c_size_t, c_int, c_int, ptr, ptr]
    # ncclCommInitRank(&comm, nranks, commId, rank)
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ptr), c_int, _UniqueId, c_int]
    lib.ncclCommDestroy.argtypes = [ptr]
    return lib


class DirectComm:
    """One NCCL communicator over the default process group's ranks, on its own stream."""

    def __init__(self, lib: ctypes.CDLL, comm: ctypes.c_void_p, stream: torch.cuda.Stream):
        self.lib, self.comm, self.stream = lib, comm, stream

    @classmethod
    def create(cls, device: torch.device) -> DirectComm | None:
        """Collective: every rank of the default group must call it. None when unavailable."""
        lib = _load()
        ok = torch.tensor([1 if lib is not None else 0], dtype=torch.int32, device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # all ranks take the same path
        if not int(ok.item()) or lib is None:
            return None
        uid = _UniqueId()
        shared = [b""]
        if dist.get_rank() == 0:
            rc = lib.ncclGetUniqueId(ctypes.byref(uid))
            shared = [bytes(uid) if rc == 0 else b""]
        dist.broadcast_object_list(shared, src=0)  # an empty id tells every rank to skip
        if not shared[0]:
            logger.warning("direct NCCL timing skipped: ncclGetUniqueId failed on rank 0")
            return None
        uid = _UniqueId.from_buffer_copy(shared[0])
        comm = ctypes.c_void_p()
        with torch.cuda.device(device):
            rc = lib.ncclCommInitRank(
                ctypes.byref(comm), dist.get_world_size(), uid, dist.get_rank()
            )
        _check(lib, rc, "ncclCommInitRank")
        return cls(lib, comm, torch.cuda.Stream(device=device))

    def launcher(self, view: torch.Tensor, calls: int) -> Callable[[], None]:
        """``calls`` in-place float32 sums of ``view`` on this communicator's stream."""
        ptr, count, stream = view.data_ptr(), view.numel(), self.stream.cuda_stream
        lib, comm = self.lib, self.comm

        def launch() -> None:
            self.stream.wait_stream(torch.cuda.current_stream())
            failed = 0
            for _ in range(calls):
                failed |= lib.ncclAllReduce(ptr, ptr, count, NCCL_FLOAT32, NCCL_SUM, comm, stream)
            torch.cuda.current_stream().wait_stream(self.stream)
            _check(lib, failed, "ncclAllReduce")

        return launch

    def close(self) -> None:
        torch.cuda.synchronize()
        rc = self.lib.ncclCommDestroy(self.comm)
        if rc != 0:
            logger.warning("ncclCommDestroy returned %d", rc)


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what} failed: {lib.ncclGetErrorString(rc).decode()} ({rc})")
