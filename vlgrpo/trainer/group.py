"""Joining the data-parallel process group under torchrun (NCCL on GPUs, gloo on CPUs), on store keys of the restart
attempt's own, picking this rank's device, and leaving the group and the process at the end of a finished run.
Knows nothing of models or data.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch


def join_group(timeout_s: float = 3600.0) -> str:
    """Under torchrun (WORLD_SIZE > 1) join the process group (NCCL on GPUs, gloo on CPUs) on this attempt's own
    store keys (`_attempt_store`), every collective bounded by `timeout_s` (train.dist_timeout_s: NCCL's own default
    is 10 minutes, shorter than a 7B checkpoint write the other ranks wait for); pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    if world > 1 and not torch.distributed.is_initialized():
        from datetime import timedelta

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        timeout = timedelta(seconds=timeout_s)
        store = _attempt_store(world, timeout)
        if store is None:
            torch.distributed.init_process_group(backend, timeout=timeout)
        else:
            torch.distributed.init_process_group(
                backend, store=store, rank=int(os.environ["RANK"]), world_size=world, timeout=timeout
            )
    return f"cuda:{local}" if torch.cuda.is_available() else "cpu"


def _attempt_store(world: int, timeout):
    """The launcher's store under a prefix of this restart attempt's own, or None outside torchrun's agent store.

    torchrun keeps ONE store for every restart of the group (its static rendezvous creates it once; the c10d one
    shares its server) and its workers use it without a per-attempt prefix. The process group publishes each rank's
    address there, so after a restart a rank could read a peer's address of the killed attempt and fail with
    "Gloo connectFullMesh failed ... Connection refused" (about half the restarts here). Keys under
    `vlgrpo/attempt_<TORCHELASTIC_RESTART_COUNT>` are new for every attempt."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None
    store = torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    return torch.distributed.PrefixStore(f"vlgrpo/attempt_{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def launched_as_rank() -> bool:
    """True in a process torchrun started as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def leave_group() -> None:
    """A finished run's last collective: every rank waits for the others, then the group is destroyed (torchrun
    reports a failure when a rank exits with its group still up). Does nothing outside a group."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank whose run has finished, its files closed and its group left: flush, then exit without the
    interpreter's teardown.

    DeepSpeed's ZeRO-3 engine stays reachable after the run (its parameter hooks are held by autograd's C++ side,
    which Python's collector cannot free) and with it two gloo process groups and their worker threads
    (`pt_gloo_runloop`): `destroy_process_group` shuts them down but cannot free them. Tearing them down during
    interpreter finalization, in whatever order it frees objects, now and then aborts the rank ("terminate called
    without an active exception", SIGABRT) after a run that completed; torchrun then reports the whole run failed.
    Nothing of the run is left to write at this point, so the process leaves at once."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(code)
