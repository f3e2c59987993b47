"""The one training loop and what it keeps.

train.py      the loop, shared by every strategy: setup, one iteration in phases, epochs
job.py        one process's run: what setup builds, the loop advances, the summary reads
state.py      the resumable position of a run (TrainState) and its stopwatch
checkpoint.py the Checkpointer: named stateful parts saved and restored, never the loop's own object
identity.py   a run's fingerprint (config, code, data): what a checkpoint must match; no torch
timing.py     an iteration's phase split at one host synchronisation, and the GPU check
              that nothing else synchronises (train.sync_debug)
precision.py  fp32, bf16 and fp16 autocast
speed.py      knobs of how fast, not what: channels-last, torch.compile, the SGD kernels
monitor.py    CPU, memory and GPU sampling while the loop runs
summary.py    the run summary from explicit inputs and every rank's report; a diverged
              run's failed record
scalars.py    the run's per-iteration scalars as a TensorBoard event file, written from
              its records once training is over (no torch)
"""
