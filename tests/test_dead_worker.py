"""A process of a ps or ddp run that hangs (SIGSTOP: a stuck node, a frozen container) fails the
others within parallel.timeout_s, with a message naming it and the remedy; never a 30-minute
hang. (One that dies is tests/finished_demo/test_integrity.py's: torchrun notices at once and names it.)"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from pipeline.config import schema, stages
from pipeline.config.params import canonical
from pipeline.runtime import distributed
from pipeline.runtime.records.training import RunSummary
from pipeline.strategies.sweep import runs

from .conftest import (
    HANG_S,
    REPO,
    checkpoint_inside_an_epoch,
    free_port,
    process_state,
    process_tree,
    signal_each,
    small_config,
    wait_for,
)

TIMEOUT_S = 5


def process_rank(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ps", "ddp"])
def test_a_hung_worker_fails_its_peers_within_the_timeout(small_dataset, tmp_path, strategy):
    # Epochs enough that rank 1 is still training when it is stopped, however slowly the
    # machine runs (2 epochs once ended before a busy test runner stopped it); the hang ends it.
    cfg = schema.replaced(small_config(small_dataset, epochs=50, checkpoint_every=2),
                          parallel={"timeout_s": TIMEOUT_S, "crash_retries": 0},  # the hang, not a retry
                          sweep=[{"strategy": strategy, "workers": 2, "images_per_worker": 2}])
    run = next(iter(runs(cfg).values()))
    out = tmp_path / "run"
    train_cfg = stages.view(cfg, "train")  # what the workflow sends the launcher
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pipeline.launch", "--config", canonical(train_cfg.model_dump()),
         "--entry", canonical(run.to_json()),
         "--out", str(out)], cwd=REPO, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), line))
                                              for line in launcher.stderr], daemon=True)
    reader.start()
    wait_for(lambda: checkpoint_inside_an_epoch(out), "a checkpoint inside an epoch", process=launcher)
    # the launcher exec'd torchrun: its children are the workers
    victim = wait_for(lambda: next((pid for pid in process_tree(launcher.pid)[1:] if process_rank(pid) == 1), None),
                      "rank 1's process", process=launcher)
    os.kill(victim, signal.SIGSTOP)  # the worker only (its loader workers, if any, would never be woken)
    stopped = time.monotonic()
    try:
        wait_for(lambda: process_state(victim) in ("T", "Z", None), "rank 1 to be stopped (state T)")
        failed = wait_for(lambda: next((at for at, line in lines if "lost the other processes" in line), None),
                          "a survivor to report it lost the other processes", timeout=HANG_S)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{''.join(line for _, line in lines)[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # already SIGKILLed by torchrun: nothing to wake
            os.kill(victim, signal.SIGCONT)  # torchrun's SIGTERM reaches it only once it runs again
        try:
            launcher.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:  # the test failed already: leave nothing running
            signal_each(process_tree(launcher.pid), signal.SIGKILL)
            launcher.wait()
        reader.join(timeout=60)
    text = "".join(line for _, line in lines)
    # How fast is measured, not asserted (no timing assertions): the message below says the
    # heartbeat watch saw rank 1 silent, not some later failure of a collective.
    print(f"{strategy}: the survivor failed {failed - stopped:.1f} s after rank 1 froze "
          f"(parallel.timeout_s {TIMEOUT_S})")
    message = next(line for _, line in lines if "lost the other processes" in line)
    assert "rank 1 has been silent for" in message and "it died or hangs" in message, message
    assert "rerun the same command to resume" in message and "parallel.timeout_s" in message
    # a lost rank is a crash: with its retries spent (none here) the run is recorded as failed,
    # its checkpoint kept, and the job ends well for the workflow to go on (runtime/attempts.py)
    assert launcher.returncode == 0, text[-3000:]
    summary = RunSummary.read(out / "train_summary.json")
    assert summary.status == "failed" and [a.ended for a in summary.failed_attempts or []] == [
        "a rank was killed or lost"], summary.reason
    assert (out / "state" / "checkpoint.pt").exists()


def test_each_way_gloo_reports_a_lost_peer_is_recognised():
    """The words of a collective that failed for a dead or hung peer, as gloo says them (its
    timeout in DDP's buffer broadcast ended the hung-worker test above with the last one)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for words in ("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer",
                      "Application timeout caused pair closure", "Timed out waiting 5000ms"):
            message = distributed.lost_peers(RuntimeError(words))
            assert message and "lost the other processes" in message and words[:20] in message
        assert distributed.lost_peers(ValueError("a wrong shape")) is None
    finally:
        dist.destroy_process_group()
