"""Launch-template user data of the nodes: MIME multipart for AL2023's nodeadm.

Managed node groups merge the ``application/node.eks.aws`` parts (NodeConfig) with their own config; the EKS user
guide's launch-template page (awsdocs/amazon-eks-user-guide ``latest/ug/nodes/launch-templates.adoc``, "Amazon EKS
optimized Amazon Linux 2023 AMIs") documents the multipart format.
"""

from __future__ import annotations

import base64

# EFA registers memory with the NIC, which needs an unlimited RLIMIT_MEMLOCK. The trainer runs
# non-root under Pod Security 'restricted' (no IPC_LOCK), so it cannot raise the limit itself:
# nodeadm merges this into containerd's base runtime spec, the default rlimits of every container.
# Managed node groups merge MIME parts of type application/node.eks.aws with their own config.
#
# Every number here passes through nodeadm's merge, which decodes JSON into Go float64 and writes
# it back with Go's shortest float formatting; containerd then decodes the file into uint64
# fields. RLIM_INFINITY (2^64-1) comes out as 18446744073709552000, which overflows uint64, so
# containerd refuses the spec and the node never becomes Ready. 2^53-1 is the largest integer
# that every float64 JSON path carries exactly; as bytes (8 PiB) it is unlimited in practice.
MEMLOCK_BYTES = 2**53 - 1
NOFILE_SOFT, NOFILE_HARD = 65536, 1048576  # nodeadm's own defaults, restated since the list is replaced whole

_EFA_SPEC = f"""\
  containerd:
    baseRuntimeSpec:
      process:
        rlimits:
          - type: RLIMIT_MEMLOCK
            hard: {MEMLOCK_BYTES}
            soft: {MEMLOCK_BYTES}
          - type: RLIMIT_NOFILE
            hard: {NOFILE_HARD}
            soft: {NOFILE_SOFT}
"""

# The instance store as one RAID0 array under the kubelet's, containerd's and the pod logs' directories: nodeadm's
# NodeConfig ``spec.instance.localStorage.strategy`` (awslabs/amazon-eks-ami nodeadm/api/v1alpha1/nodeconfig_types.go,
# LocalStorageOptions: RAID0 | RAID10 | Mount) runs setup-local-disks raid0 (templates/al2023/runtime/bin/
# setup-local-disks: mdadm RAID0 of every NVMe instance store disk, XFS, bind-mounted over /var/lib/kubelet,
# /var/lib/containerd and /var/log/pods; no instance store disk: it exits 0 and changes nothing). Images are then
# extracted onto NVMe instead of the gp3 root volume, and emptyDir scratch lives there too.
_RAID0_SPEC = """\
  instance:
    localStorage:
      strategy: RAID0
"""


def node_config_user_data(*, efa: bool, raid0: bool) -> str | None:
    """Base64 launch-template user data: one NodeConfig MIME part (EFA nodes' memlock, the instance store as
    RAID0), or None when neither applies."""
    spec = (_EFA_SPEC if efa else "") + (_RAID0_SPEC if raid0 else "")
    if not spec:
        return None
    text = ('MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="EKSDDP"\n\n--EKSDDP\n'
            "Content-Type: application/node.eks.aws\n\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\n"
            f"spec:\n{spec}\n--EKSDDP--\n")
    return base64.b64encode(text.encode()).decode()
