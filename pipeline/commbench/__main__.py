"""The commbench stage: what the cost model measures on this machine at N processes, with the
preset's model. The links (send/recv, all-reduce and broadcast, timed over message sizes and
fitted: links.py), how much slower the model computes when all N processes compute at once
(shared_compute.py), what an exchange costs inside such a step (in_step.py), and what each
strategy that asks for it adds to the model's forward + backward (`Strategy.calibrate`: FSDP2).

    python -m pipeline.launch --stage commbench --processes N --config '<stage JSON>' --out FILE

which becomes the job's torchrun (job.py), starting `python -m pipeline.commbench` in each process.

The sizes and repeats are the config's `commbench` section (params.yaml). A measurement outside
the band a quiet machine's fall in (pipeline/costmodel/bands.py: the CPU other processes took
meanwhile, the spread of its repeats, the shared-compute factor) is measured again, up to
`commbench.retries` more times; one that stays outside is kept marked `disturbed` (its
`check`: the reason and every attempt's values), and the JSON's `disturbed` lists them all, for the report.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import cli
from ..costmodel import bands
from ..runtime import distributed, lifetime, provenance
from ..runtime.files import write_json
from ..strategies import REGISTERED
from . import links, shared_compute

log = logging.getLogger("commbench")


def disturbed_of(primitives: dict, shared: dict | None, calibrations: dict | None) -> list[str]:
    """'what: reason' for each measurement that stayed outside its band (its check's)."""
    checks = [(f"{name} link", p.get("check")) for name, p in primitives.items()]
    checks.append(("shared compute", (shared or {}).get("check")))
    checks += [
        (f"{name} timed on the model", check) for name, check in ((calibrations or {}).get("checks") or {}).items()
    ]
    return [f"{what}: {check['disturbed']}" for what, check in checks if check and check.get("disturbed")]


def in_step_line(terms: dict) -> str:
    return (
        f"wait for the slower worker {terms['wait_s'] * 1e3:.1f} ms (formula "
        f"{terms['formula_wait_s'] * 1e3:.1f} ms), contention x{terms['contention']:.2f}, "
        f"{terms['bucket_s'] * 1e3:.2f} ms per bucket, {terms['message_s'] * 1e3:.2f} ms per message"
    )


def main(argv: list[str] | None = None) -> None:
    def body(args):
        cfg = args.cfg
        settings = cfg.commbench
        member = distributed.init_process_group(cfg.parallel.backend, cfg.parallel.timeout_s, threads=0)
        message_sizes = links.sizes(settings.min_bytes, settings.max_bytes)
        primitives = links.measure(
            member.device, member.rank, member.processes, message_sizes, settings.repeats, settings.retries
        )
        images, repeats = settings.compute_images, settings.compute_repeats
        shared = calibrations = None
        if member.processes > 1:
            expected = bands.expected_factor(
                member.device.type, member.processes, member.threads, distributed.available_cores()
            )
            shared, check = bands.checked(
                f"shared compute over {member.processes} processes",
                lambda: links.with_other_load(
                    lambda: shared_compute.measure(
                        cfg.model, images, repeats, member.device, member.rank, member.processes, expected, primitives
                    ),
                    member.device,
                    member.rank,
                ),
                bands.shared_verdict,
                lambda found: {
                    key: found[key]
                    for key in ("alone_s", "together_s", "factor", "alone_spread", "together_spread", "other_load")
                },
                settings.retries,
                speak=member.rank == 0,
            )
            shared["check"] = check
            calibrations = shared_compute.calibrations(
                REGISTERED,
                cfg.model,
                images,
                repeats,
                member.device,
                member.processes,
                settings.retries,
                shared,
                speak=member.rank == 0,
                rank=member.rank,
            )
        if member.rank == 0:
            for name, found in (calibrations or {}).get("strategies", {}).items():
                log.info(
                    "%s on the model: %s",
                    name,
                    ", ".join(f"{key} {seconds * 1e3:.1f} ms" for key, seconds in found.items()),
                )
            if shared:
                log.info(
                    "forward + backward of %d images: %.1f ms alone, %.1f ms with all %d processes at once (x%.3f)",
                    shared["images"],
                    shared["alone_s"] * 1e3,
                    shared["together_s"] * 1e3,
                    member.processes,
                    shared["factor"],
                )
            if shared and shared.get("in_step"):
                log.info("inside a step: %s", in_step_line(shared["in_step"]))
            disturbed = disturbed_of(primitives, shared, calibrations)
            for line in disturbed:
                log.warning("disturbed, kept marked: %s", line)
            write_json(
                Path(args.out),
                {
                    "backend": member.backend,
                    "processes": member.processes,
                    "repeats": settings.repeats,
                    "primitives": primitives,
                    "shared_compute": shared,
                    "calibrations": calibrations,
                    "bands": bands.BANDS_TEXT,
                    "disturbed": disturbed,
                    "provenance": provenance.collect(
                        cfg.model_dump(),
                        processes=member.processes,
                        backend=member.backend,
                        device=str(member.device),
                        threads=member.threads,
                    ),
                },
            )
        distributed.destroy_process_group()

    # its parallel, commbench and model sections, and the knobs
    cli.run_stage(
        __doc__.split("\n\n")[0],
        body,
        stage="commbench",
        argv=argv,
        arguments=lambda parser: parser.add_argument("--out", required=True),
    )


if __name__ == "__main__":
    main()
    lifetime.exit_finished()  # not through the teardown (runtime/lifetime.py)
