"""The data stage: make the configured dataset available, validate it, write its manifest.

    python -m pipeline.prepare --config '<data section JSON>' --manifest data/NAME.manifest.json
    python -m pipeline.prepare --params params.yaml --preset demo --manifest ...   (dvc.yaml)

The synthetic dataset is generated (deterministically) in place; any other dataset must already
be in the COCO 2017 layout under data.root. The manifest (annotation checksums, counts, skips)
is what training depends on.
"""
from __future__ import annotations

import argparse
import json
import logging

from . import params, synthetic
from .dataset import DatasetError, build_manifest
from .files import write_json


def prepare(data_cfg: dict, manifest_path: str) -> dict:
    small = data_cfg["synthetic"] is not None
    if small:
        counts = synthetic.generate(data_cfg["root"], data_cfg["synthetic"])
        logging.info("generated %s: %s", data_cfg["root"], counts)
    manifest = build_manifest(data_cfg["root"], decode_images=small)
    write_json(manifest_path, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prepare and validate the configured dataset.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="the data section of the preset, as JSON (Snakefile)")
    source.add_argument("--params", help="a params.yaml to read the data section from (dvc.yaml)")
    parser.add_argument("--preset", help="with --params: the preset (default: the file's own)")
    parser.add_argument("--manifest", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.params:
            data_cfg = params.load_resolved(args.params, args.preset)["data"]
        else:
            data_cfg = json.loads(args.config)
        manifest = prepare(data_cfg, args.manifest)
    except (DatasetError, params.ParamsError) as err:
        raise SystemExit(f"error: {err}") from None
    print(json.dumps(manifest["splits"], indent=1))


if __name__ == "__main__":
    main()
