"""How long GCE warns before it stops a VM: the lengths the notice agent dates its drains by.

Pure and in the core because two layers need the same figures: the agent (``notices``), which
turns a notice into a Ray drain with this deadline, and the deployment files (``deploy``),
which tell each node's agent the notice its kind of VM gets.
"""

from __future__ import annotations

# A Spot VM's preemption notice (instance/preempted), unless its node pool or instance sets a
# longer one.
GCP_PREEMPTION_NOTICE_S = 30.0
# Host maintenance that stops the VM (instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE):
# "Compute Engine gives GPU VMs a 1-hour stopping notice, while normal VMs receive only a
# 60-second notice" (cloud.google.com/compute/docs/gpus/gpu-host-maintenance). GCE sets the key
# only on VMs with GPUs and on VMs set to migrate.
GCP_MAINTENANCE_NOTICE_S = 60.0
GCP_GPU_MAINTENANCE_NOTICE_S = 3600.0
