"""Deployment files for a tier ladder: KubeRay RayJob/RayCluster, Ray cluster-launcher configs,
and their offline validation. Pure (no Ray, no cluster, no network); see docs/deploy.md."""

from spotfallback.deploy.clouds import K8sCloud, VmCloud
from spotfallback.deploy.common import to_yaml, unique_run_name
from spotfallback.deploy.kuberay import (
    Kind,
    KubeRayOptions,
    kuberay_manifest,
    rayjob_entrypoint,
    render_kuberay,
)
from spotfallback.deploy.launcher import (
    LauncherOptions,
    cluster_launcher_config,
    render_cluster_launcher,
)
from spotfallback.deploy.validate import (
    Finding,
    Report,
    validate_document,
    validate_file,
    validate_text,
)

__all__ = [
    "Finding",
    "K8sCloud",
    "Kind",
    "KubeRayOptions",
    "LauncherOptions",
    "Report",
    "VmCloud",
    "cluster_launcher_config",
    "kuberay_manifest",
    "rayjob_entrypoint",
    "render_cluster_launcher",
    "render_kuberay",
    "to_yaml",
    "unique_run_name",
    "validate_document",
    "validate_file",
    "validate_text",
]
