"""Regenerate the schemas shipped in src/spotfallback/data/ from their sources.

    .venv/bin/python scripts/vendor_kuberay_schema.py [--kuberay ../shared/kuberay]

- data/kuberay/{rayjob,raycluster}.v1.json: the `openAPIV3Schema` of version v1 of the KubeRay
  CRDs (descriptions dropped to keep the package small; strictness is added at load time, see
  spotfallback.deploy.schema.make_strict).
- data/ray/cluster-launcher.schema.json: Ray's own `ray/autoscaler/ray-schema.json`, from the
  Ray installed in this environment (read as a file; Ray is not imported).

Each file records where it came from and the sha256 of that source, so a test can tell when
the shipped copy and the source drift apart.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
from importlib.metadata import version
from pathlib import Path

import yaml

from spotfallback.deploy.schema import KUBERAY_FILES, LAUNCHER_FILE, extract_crd_schema

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "src" / "spotfallback" / "data"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 40k lines of YAML
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}


def kuberay_payload(crd_path: Path) -> dict:
    text = crd_path.read_text("utf-8")
    return {
        "source": f"{crd_path.name} (KubeRay v1.7 CRD), version v1, openAPIV3Schema",
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "generated_by": "scripts/vendor_kuberay_schema.py",
        "schema": extract_crd_schema(yaml.load(text, Loader=_LOADER), "v1"),
    }


def launcher_payload() -> dict:
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        raise SystemExit("ray is not installed; cannot copy its cluster-launcher schema")
    path = Path(spec.origin).parent / "autoscaler" / "ray-schema.json"
    text = path.read_text("utf-8")
    return {
        "source": f"ray {version('ray')}: ray/autoscaler/ray-schema.json",
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "generated_by": "scripts/vendor_kuberay_schema.py",
        "schema": json.loads(text),
    }


def dump(payload: dict) -> str:
    # Compact: indenting the deeply nested pod schema triples the file for no reader's benefit.
    return json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kuberay", type=Path, default=REPO.parent / "shared" / "kuberay")
    parser.add_argument("--skip-launcher", action="store_true", help="leave the Ray schema as is")
    args = parser.parse_args()
    for kind, target in KUBERAY_FILES.items():
        out = DATA / "kuberay" / target
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(dump(kuberay_payload(args.kuberay / CRD_FILES[kind])), "utf-8")
        print(f"wrote {out.relative_to(REPO)}")
    if not args.skip_launcher:
        out = DATA / "ray" / LAUNCHER_FILE
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(dump(launcher_payload()), "utf-8")
        print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
