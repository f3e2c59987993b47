"""The commbench stage: what the cost model measures on this machine at N processes, with the
preset's model. The links (send/recv, all-reduce, broadcast and FSDP2's units, timed over message
sizes and fitted: pipeline/costmodel/links.py), and how much slower the model computes when all N
processes compute at once (pipeline/training/shared_compute.py).

    python -m pipeline.runtime.elastic --nproc-per-node N -m pipeline.commbench --config '<stage JSON>' --out FILE

The sizes and repeats are the config's `commbench` section (params.yaml).
"""
from __future__ import annotations

import logging
from pathlib import Path

from .config import cli
from .costmodel import links
from .runtime import distributed, lifetime, provenance
from .runtime.files import write_json
from .training import shared_compute

log = logging.getLogger("commbench")


def main(argv: list[str] | None = None) -> None:
    def body(args):
        cfg = args.cfg
        settings = cfg["commbench"]
        member = distributed.init_process_group(cfg["parallel"], threads=0)
        message_sizes = links.sizes(settings["min_bytes"], settings["max_bytes"])
        primitives = links.measure(member.device, member.rank, member.processes, message_sizes,
                                   settings["repeats"])
        shared = (shared_compute.measure(cfg["model"], settings["compute_images"],
                                         settings["compute_repeats"], member.device, member.rank,
                                         member.processes)
                  if member.processes > 1 else None)
        if member.rank == 0:
            if shared:
                log.info("forward + backward of %d images: %.1f ms alone, %.1f ms with all %d "
                         "processes at once (x%.3f)", shared["images"], shared["alone_s"] * 1e3,
                         shared["together_s"] * 1e3, member.processes, shared["factor"])
            write_json(Path(args.out), {
                "backend": member.backend, "processes": member.processes,
                "repeats": settings["repeats"], "primitives": primitives, "shared_compute": shared,
                "provenance": provenance.collect(cfg, processes=member.processes,
                                                 backend=member.backend, device=str(member.device),
                                                 threads=member.threads)})
        distributed.destroy_process_group()

    # its parallel, commbench and model sections, and the knobs
    cli.run_stage(__doc__.split("\n\n")[0], body, stage="commbench", argv=argv,
                  arguments=lambda parser: parser.add_argument("--out", required=True))


if __name__ == "__main__":
    main()
    lifetime.exit_finished()  # not through the teardown (runtime/lifetime.py)
