"""Joining the data-parallel process group under torchrun (NCCL on GPUs, gloo on CPUs), on store keys of the restart
attempt's own, picking this rank's device, and leaving the group and the process at the end of a finished run; the
restart attempt every node agrees on (`launch_attempt`). Knows nothing of models or data.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch

RDZV_ENDPOINT = "VLGRPO_RDZV_ENDPOINT"
"""The environment variable naming torchrun's `--rdzv-endpoint` (host:port) on a run of several nodes
(`scripts/train_multinode.sh` sets it): the ranks read the rendezvous' round there (`launch_attempt`)."""


class LaunchError(RuntimeError):
    """A launch the ranks cannot place among its restarts (several nodes without the rendezvous endpoint)."""


def launch_attempt() -> int:
    """This launch's restart attempt, the same number on every rank of every node: 0 for a new launch, then one more
    for each restart of the group (outside torchrun: 0).

    On one node it is torchrun's restart count (`TORCHELASTIC_RESTART_COUNT`): one agent restarts every rank. On
    several nodes each agent counts only the restarts its own workers caused, so after a rank of node A fails, A's
    ranks would start attempt 1 and B's attempt 0 (B would then read the dead attempt's addresses, and clear the
    record of a permanent failure). The number the nodes agree on is the c10d rendezvous' round: every restart is a
    new round, which every agent joins; a new launch starts a new rendezvous at round 0. It is read from the
    rendezvous' own store at `VLGRPO_RDZV_ENDPOINT` (its state under `torch.rendezvous.<run id>`)."""
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) <= 1:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return _rendezvous_round()


def _rendezvous_round() -> int:
    from base64 import b64decode
    from datetime import timedelta
    from pickle import loads

    endpoint, run_id = os.environ.get(RDZV_ENDPOINT, ""), os.environ.get("TORCHELASTIC_RUN_ID", "")
    nodes = os.environ.get("GROUP_WORLD_SIZE")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not run_id:
        raise LaunchError(
            f"a run on {nodes} nodes needs {RDZV_ENDPOINT}=host:port, torchrun's --rdzv-endpoint (the c10d "
            f"rendezvous), to agree on its restart attempt across nodes (got {RDZV_ENDPOINT}={endpoint!r}); "
            "scripts/train_multinode.sh sets it"
        )
    try:
        store = torch.distributed.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
        key = f"torch.rendezvous.{run_id}"  # the state as torch's c10d backend keeps it: base64 of a pickle
        if not store.check([key]):
            raise KeyError(f"no rendezvous state under '{key}'")
        return int(loads(b64decode(store.get(key))).round)
    except Exception as e:  # unreachable store, another backend, or a torch whose state has no round
        raise LaunchError(
            f"cannot read the restart attempt from the c10d rendezvous at {endpoint} (run id {run_id!r}): "
            f"{type(e).__name__}: {e}; launch the nodes with --rdzv-backend c10d --rdzv-endpoint {endpoint} "
            "(scripts/train_multinode.sh does)"
        ) from None


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
    `vlgrpo/attempt_<launch_attempt()>` are new for every attempt, on every node alike."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None
    store = torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    return torch.distributed.PrefixStore(f"vlgrpo/attempt_{launch_attempt()}", store)


def bound_every_group(timeout_s: float) -> int:
    """Give every process group this rank is in `timeout_s` (train.dist_timeout_s) -> the groups set. Groups made
    with `new_group` (DeepSpeed's data-parallel group, on which ZeRO-3 reduce-scatters gradients and all-reduces
    their norm) take the backend's default, not the world group's: 30 minutes on gloo, 10 on NCCL, so a rank blocked
    mid-update made its peers abort there, before the watchdog named it. Call once the groups exist."""
    from datetime import timedelta

    from torch.distributed.distributed_c10d import _world

    n = 0
    for group in list(_world.pg_map):  # torch's registry of this process's groups
        try:
            torch.distributed.set_timeout(timedelta(seconds=timeout_s), group)
        except ValueError:  # a group this rank is not in
            continue
        n += 1
    return n


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
