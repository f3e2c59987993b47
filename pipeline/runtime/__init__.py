"""Process plumbing, the ground floor: nothing here imports detection, strategies or reports.

files.py        atomic writes, output errors that name the remedy, what the pipeline made
listing.py      what a tree the pipeline made held when written (sizes, times, hashes), what differs now
distributed.py  process groups: start, finish, gather, lost peers, heartbeat
elastic.py      torchrun, naming the rank that failed first and its own error (what `python -m` starts)
failure.py      why a run failed, in one line, from the failing process to whoever reads it
attempts.py     a training job's attempts: a crash retried from its checkpoint, a failure recorded
lifetime.py     a job's processes die with it
logs.py         how a stage's processes log: each line with its rank, the data's lines once
slurm.py        the allocation a multi-node run is inside
stale_locks.py  Snakemake's locks left by a killed run
run_lock.py     one process at a time trains or evaluates a run (a lock on its directory)
compat.py       the torch versions the pipeline runs on (2.4 to the lock's)
provenance.py   what every result carries: git revision, packages, hardware
run.py          one run of the sweep, typed: filled once by the sweep, read by all that runs it
records/        the run records, typed, one module per stage that writes them:
                train_summary.json (upgraded from older run folders), the provenance,
                metrics.json, commbench's and the equivalence check's files
"""
