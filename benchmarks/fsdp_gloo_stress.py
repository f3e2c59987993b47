"""FSDP2 over gloo alone, many steps a second, under glibc's heap checks: issue 57's abort
("malloc(): unaligned fastbin chunk detected", rank 1 of fsdp-w2-b4-s0) isolated from the
project. Uses no project code, so a crash here is torch's (a standalone reproducer) and a run
without one says these code paths alone did not corrupt the heap in that many steps.

    .venv/bin/python benchmarks/fsdp_gloo_stress.py --steps 5000 [--keep-gathered]
        [--store-thread-ms 1] [--processes 2]

The parent starts `--processes` ranks of this file (the environment torchrun would give them)
with MALLOC_CHECK_=3 (glibc's debug library preloaded, as glibc 2.34 on needs), MALLOC_PERTURB_
and faulthandler on. Each rank shards a small convolutional net in 8 units (BatchNorm in each,
odd channel counts so that FSDP2 pads its shards), steps SGD with momentum on random images and,
with --store-thread-ms, a second thread writes to the process group's store that often, as the
project's heartbeat does once a second. Prints each rank's end (exit code or signal, last line).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

DEBUG_MALLOC = Path("/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    widths = [3, 17, 33, 31, 65, 63, 129, 127]  # odd: shards padded
    blocks = [
        torch.nn.Sequential(torch.nn.Conv2d(a, b, 3, padding=1), torch.nn.BatchNorm2d(b), torch.nn.ReLU())
        for a, b in zip(widths[:-1], widths[1:], strict=True)
    ]
    model = torch.nn.Sequential(*blocks, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(127, 7))
    for block in blocks:
        fully_shard(block, reshard_after_forward=not args.keep_gathered)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if args.store_thread_ms:
        store = dist.distributed_c10d._get_default_store()

        def beat():
            while True:
                try:
                    store.set(f"beat/{rank}", repr(time.time()))
                except Exception:
                    return
                time.sleep(args.store_thread_ms / 1000)

        threading.Thread(target=beat, daemon=True).start()
    start = time.monotonic()
    for step in range(args.steps):
        images = torch.randn(2, 3, 8, 8)  # small: the collectives, not the compute, fill a step
        loss = model(images).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and (step + 1) % max(1, args.steps // 10) == 0:
            print(f"step {step + 1}/{args.steps}, {time.monotonic() - start:.0f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--keep-gathered", action="store_true", help="reshard_after_forward=False")
    parser.add_argument("--store-thread-ms", type=float, default=0, help="a thread writes the store this often")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.processes))
    env.update(MALLOC_CHECK_="3", MALLOC_PERTURB_="165", PYTHONFAULTHANDLER="1")
    if DEBUG_MALLOC.exists():
        env["LD_PRELOAD"] = str(DEBUG_MALLOC)
    began = time.monotonic()
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", *sys.argv[1:]],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=None if r == 0 else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(args.processes)
    ]
    ended = []
    for rank, process in enumerate(ranks):
        _, err = process.communicate()
        code = process.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        last = next((line for line in reversed(err.splitlines()) if line.strip()), "")
        ended.append(code)
        print(f"rank {rank}: {how}" + (f"; last line: {last}" if code else ""), flush=True)
    print(
        f"{args.steps} steps x {args.processes} ranks, reshard_after_forward={not args.keep_gathered}, "
        f"store thread every {args.store_thread_ms or 'never'} ms, MALLOC_CHECK_=3: "
        f"{'crashed' if any(ended) else 'no crash'} in {time.monotonic() - began:.0f} s"
    )
    sys.exit(1 if any(ended) else 0)


if __name__ == "__main__":
    main()
