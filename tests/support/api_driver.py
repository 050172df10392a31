"""A driver process on the Python API with an explicit filesystem object (S3, or a faulty local one).

``spotfallback run`` takes a job file, which cannot carry a filesystem object; this is the
other way users run: ``RunConfig(storage_path="bucket/runs", storage_filesystem=S3FileSystem(...))``.
Run as ``python -m tests.support.api_driver '<json spec>'`` from the repository root``; prints one JSON line when the run finishes,
so a test can SIGKILL it and start it again, exactly like a crashed driver being relaunched.
Spec keys: address, storage_path, name, config, tiers, and ``s3_endpoint`` or ``faulty_control``.
"""

from __future__ import annotations

import json
import logging
import sys


def main(spec: dict) -> int:
    import ray
    import ray.train

    from spotfallback import FallbackTrainer, Tier
    from spotfallback.examples.ddp_digits import train_fn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ray.init(address=spec["address"], log_to_driver=False, logging_level=logging.WARNING)
    fs = None
    if spec.get("s3_endpoint"):
        from tests.support.s3server import s3_filesystem

        fs = s3_filesystem(spec["s3_endpoint"])
    elif spec.get("faulty_control"):
        from tests.faultyfs import faulty_filesystem  # the module path Ray's workers import it by

        fs = faulty_filesystem(spec["faulty_control"])
    trainer = FallbackTrainer(
        train_fn,
        train_loop_config=spec["config"],
        tiers=[Tier(**t) for t in spec["tiers"]],
        run_config=ray.train.RunConfig(
            storage_path=spec["storage_path"], name=spec["name"], storage_filesystem=fs
        ),
    )
    result = trainer.fit()
    print(json.dumps({"status": "finished", "metrics": {k: v for k, v in result.metrics.items() if not isinstance(v, dict)}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
