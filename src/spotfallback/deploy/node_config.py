"""The fields a Ray cluster-launcher ``node_config`` may have, per cloud, and the misspelt ones.

Ray's launcher schema leaves ``node_config`` free-form: Ray hands it to the cloud's API as it is
(AWS: boto3's ``create_instances``; GCP: ``instances.insert``, or a TPU node's ``nodes.create``;
Azure: the parameters of Ray's ARM template). A misspelt key (``InstanceTyp``, ``machinetype``)
passes ``ray up``'s own checks and fails only when a node of that type is launched, which for a
worker type may be the first fallback to its tier, mid-run. The lists below are the cloud's own
field names, so a key outside them is a typo or another cloud's field.

Sources:
- AWS: the EC2 API Reference's RunInstances request parameters (as botocore 1.44's ``ec2``
  service model lists them; ``tests/unit/test_deploy_validate.py`` pins the two where botocore is
  installed), plus ``SubnetIds``, which Ray's AWS provider turns into one ``SubnetId`` per attempt.
- GCP: the Compute Engine API v1 ``Instance`` resource and the Cloud TPU API ``Node`` resource
  (v2 and v2alpha1; Ray makes a TPU node of a ``node_config`` with ``acceleratorType`` or
  ``acceleratorConfig``, and gives every node type both ``networkInterfaces`` and
  ``networkConfig``), from google-api-python-client 2.202's discovery documents, plus
  ``sourceInstanceTemplate``, which Ray's GCP provider passes as ``instances.insert``'s query
  parameter.
- Azure: Ray's Azure provider reads ``azure_arm_parameters`` and ``tags`` of a ``node_config``;
  the former are the parameters of Ray 2.60's ``azure-vm-template.json`` (pinned by the same test),
  plus ``availability_zone``, which the provider reads and removes. ARM refuses a deployment whose
  parameters its template lacks.
"""

from __future__ import annotations

import difflib
from typing import Any

AWS_FIELDS = frozenset({
    "AdditionalInfo", "BlockDeviceMappings", "CapacityReservationSpecification", "ClientToken", "CpuOptions",
    "CreditSpecification", "DisableApiStop", "DisableApiTermination", "DryRun", "EbsOptimized",
    "ElasticGpuSpecification", "ElasticInferenceAccelerators", "EnablePrimaryIpv6", "EnclaveOptions",
    "HibernationOptions", "IamInstanceProfile", "ImageId", "InstanceInitiatedShutdownBehavior",
    "InstanceMarketOptions", "InstanceType", "Ipv6AddressCount", "Ipv6Addresses", "KernelId", "KeyName",
    "LaunchTemplate", "LicenseSpecifications", "MaintenanceOptions", "MaxCount", "MetadataOptions", "MinCount",
    "Monitoring", "NetworkInterfaces", "NetworkPerformanceOptions", "Operator", "Placement",
    "PrivateDnsNameOptions", "PrivateIpAddress", "RamdiskId", "SecondaryInterfaces", "SecurityGroupIds",
    "SecurityGroups", "SubnetId", "TagSpecifications", "UserData",
})  # fmt: skip
AWS_RAY_FIELDS = frozenset({"SubnetIds"})

GCP_INSTANCE_FIELDS = frozenset({
    "advancedMachineFeatures", "canIpForward", "confidentialInstanceConfig", "cpuPlatform", "creationTimestamp",
    "deletionProtection", "description", "disks", "displayDevice", "fingerprint", "guestAccelerators", "hostname",
    "id", "instanceEncryptionKey", "keyRevocationActionType", "kind", "labelFingerprint", "labels",
    "lastStartTimestamp", "lastStopTimestamp", "lastSuspendedTimestamp", "localSsdEncryptionMode", "machineType",
    "metadata", "minCpuPlatform", "name", "networkInterfaces", "networkPerformanceConfig", "params",
    "privateIpv6GoogleAccess", "reservationAffinity", "resourcePolicies", "resourceStatus", "satisfiesPzi",
    "satisfiesPzs", "scheduling", "selfLink", "serviceAccounts", "shieldedInstanceConfig",
    "shieldedInstanceIntegrityPolicy", "sourceMachineImage", "sourceMachineImageEncryptionKey", "startRestricted",
    "status", "statusMessage", "tags", "workloadIdentityConfig", "zone",
})  # fmt: skip
GCP_TPU_FIELDS = frozenset({
    "acceleratorConfig", "acceleratorType", "apiVersion", "autocheckpointEnabled", "bootDiskConfig", "cidrBlock",
    "createTime", "dataDisks", "description", "health", "healthDescription", "id", "labels", "metadata",
    "multisliceNode", "name", "networkConfig", "networkConfigs", "networkEndpoints", "protectionTier",
    "queuedResource", "runtimeVersion", "schedulingConfig", "serviceAccount", "shieldedInstanceConfig", "state",
    "symptoms", "tags", "upcomingMaintenance",
})  # fmt: skip
GCP_RAY_FIELDS = frozenset({"sourceInstanceTemplate"})

AZURE_FIELDS = frozenset({"azure_arm_parameters", "tags"})
AZURE_ARM_PARAMETERS = frozenset({
    "adminUsername", "billingProfile", "enableAcceleratedNetworking", "evictionPolicy", "imageId", "imageOffer",
    "imagePublisher", "imageSku", "imageVersion", "msi", "nsg", "osDiskSize", "priority", "provisionPublicIp",
    "publicKey", "subnet", "vmCount", "vmName", "vmSize", "vmTags", "zones",
})  # fmt: skip
AZURE_RAY_ARM_PARAMETERS = frozenset({"availability_zone"})

# By provider type: the fields of node_config, and (Azure) of a section whose keys are also checked.
NODE_CONFIG_FIELDS: dict[str, frozenset[str]] = {
    "aws": AWS_FIELDS | AWS_RAY_FIELDS,
    "gcp": GCP_INSTANCE_FIELDS | GCP_TPU_FIELDS | GCP_RAY_FIELDS,
    "azure": AZURE_FIELDS,
}
SECTION_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("azure", "azure_arm_parameters"): AZURE_ARM_PARAMETERS | AZURE_RAY_ARM_PARAMETERS,
}

# What happens to a key outside the lists, said in each finding.
_CONSEQUENCE: dict[str | tuple[str, str], str] = {
    "aws": "not an EC2 RunInstances parameter: boto3 refuses it when Ray launches a node of this type",
    "gcp": ("not a field of a Compute Engine instance or a TPU node: the API refuses it when Ray launches a node "
            "of this type"),
    "azure": "not read by Ray's Azure provider, which takes only azure_arm_parameters and tags: it is ignored",
    ("azure", "azure_arm_parameters"): ("not a parameter of Ray's Azure VM template: Azure refuses the deployment "
                                        "when Ray launches a node of this type"),
}


def closest_field(key: str, known: frozenset[str]) -> str | None:
    """The known field ``key`` most likely misspells: the same name in other case first, then
    ``difflib``'s closest match (ratio 0.6 or more), else None."""
    by_lower = {name.lower(): name for name in known}
    if key.lower() in by_lower:
        return by_lower[key.lower()]
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return close[0] if close else None


def unknown_fields(provider: Any, node_config: Any) -> list[tuple[list[str], str]]:
    """``(path inside node_config, problem)`` for each key of ``node_config`` (and of a checked
    section's top level) that the ``provider``'s API does not take; none for other providers."""
    fields = NODE_CONFIG_FIELDS.get(provider) if isinstance(provider, str) else None
    if fields is None or not isinstance(node_config, dict):
        return []
    out = [([key], _problem(key, fields, _CONSEQUENCE[provider])) for key in node_config if key not in fields]
    for (cloud, section), known in SECTION_FIELDS.items():
        inner = node_config.get(section)
        if cloud == provider and isinstance(inner, dict):
            out += [([section, key], _problem(key, known, _CONSEQUENCE[cloud, section])) for key in inner if key not in known]
    return out


def _problem(key: str, known: frozenset[str], consequence: str) -> str:
    close = closest_field(str(key), known)
    fix = f"did you mean {close!r}?" if close else "remove it or check its spelling"
    return f"unknown field, {consequence}; {fix}"
