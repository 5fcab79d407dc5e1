"""Launch-template user data of the nodes: MIME multipart for AL2023's nodeadm.

Managed node groups merge the ``application/node.eks.aws`` parts (NodeConfig) with their own config; the EKS user
guide's launch-template page (awsdocs/amazon-eks-user-guide ``latest/ug/nodes/launch-templates.adoc``, "Amazon EKS
optimized Amazon Linux 2023 AMIs") documents the multipart format, NodeConfig parts and shell-script parts side by
side. On stacks whose shared storage is FSx for Lustre (``storage.backend: fsxLustre``) every node also gets a
``text/x-shellscript`` part that installs the Lustre client (:func:`lustre_client_script`): the EKS AL2023 AMIs do
not ship it (awslabs/amazon-eks-ami PR #2696 was closed with the advice to install ``lustre-client`` from user data),
and the FSx CSI driver's node plugin only runs ``mount -t lustre``, which fails without the kernel module and
``mount.lustre`` (kubernetes-sigs/aws-fsx-csi-driver issue #437, PR #460).
"""

from __future__ import annotations

import base64

from eks_ddp.core.storage import LUSTRE_VERSION

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


LUSTRE_CLIENT_PACKAGE = "lustre-client"
"""The Lustre client in the Amazon Linux 2023 repositories (FSx for Lustre user guide, "Getting started", step 2
"Install and configure the Lustre client": on AL2023 with kernel 6.1.79-99.167 or later, ``sudo dnf install -y
lustre-client``; awsdocs ``amazon-fsx-lustre-user-guide`` ``doc_source/getting-started.md`` and
``install-lustre-client.md``). AL2023 locks its repositories to the AMI's release (AL2023 user guide, "Deterministic
upgrades through versioned repositories"), so the package dnf finds was built for the kernel the node boots."""


def lustre_client_script(lustre_version: str = LUSTRE_VERSION) -> str:
    """The shell-script part that installs the Lustre client of ``lustre_version`` (the file system's,
    ``file_system_type_version``) and loads its kernel module, or fails the part loudly.

    Only a client of the file system's major.minor release is accepted (``lustre-client-2.15.*``): dnf refuses
    anything else, and the installed version is checked again so a client preinstalled by a future AMI at another
    release is reported instead of used. The result goes to the node's journal and
    ``/var/log/cloud-init-output.log`` (docs/storage.md, "Is the Lustre client on the node?"); a pod scheduled
    before the part finishes waits in ContainerCreating while the kubelet retries the mount."""
    if not lustre_version.replace(".", "").isdigit() or lustre_version.count(".") != 1:
        raise ValueError(f"lustre_version: got {lustre_version!r}; expected a major.minor Lustre release like '2.15'")
    return f"""#!/bin/bash
# eks-ddp: the Lustre {lustre_version} client for the stack's FSx for Lustre file system
set -euo pipefail
if ! rpm -q {LUSTRE_CLIENT_PACKAGE} >/dev/null 2>&1; then
  dnf install -y '{LUSTRE_CLIENT_PACKAGE}-{lustre_version}.*'
fi
installed=$(rpm -q --qf '%{{VERSION}}' {LUSTRE_CLIENT_PACKAGE})
case "$installed" in
  {lustre_version}|{lustre_version}.*) ;;
  *) echo "eks-ddp: {LUSTRE_CLIENT_PACKAGE} $installed is not Lustre {lustre_version}, the file system's" >&2; exit 1 ;;
esac
modprobe lustre
echo "eks-ddp: {LUSTRE_CLIENT_PACKAGE} $installed, module $(modinfo -F version lustre 2>/dev/null || echo '?'),\
 kernel $(uname -r): ready for Lustre {lustre_version}"
"""


def node_user_data(*, efa: bool = False, raid0: bool = False, lustre_client: bool = False) -> str | None:
    """Base64 launch-template user data, MIME multipart: a NodeConfig part (EFA nodes' memlock, the instance store
    as RAID0) where either applies, and with ``lustre_client`` the :func:`lustre_client_script` part; None when
    nothing applies (the node group's own user data only)."""
    spec = (_EFA_SPEC if efa else "") + (_RAID0_SPEC if raid0 else "")
    parts = []
    if spec:
        parts.append("Content-Type: application/node.eks.aws\n\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\n"
                     f"spec:\n{spec}")
    if lustre_client:
        parts.append(f'Content-Type: text/x-shellscript; charset="us-ascii"\n\n{lustre_client_script()}')
    if not parts:
        return None
    text = ('MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="EKSDDP"\n\n'
            + "".join(f"--EKSDDP\n{part}\n" for part in parts) + "--EKSDDP--\n")
    return base64.b64encode(text.encode()).decode()


def node_config_user_data(*, efa: bool, raid0: bool) -> str | None:
    """Base64 launch-template user data: one NodeConfig MIME part (EFA nodes' memlock, the instance store as
    RAID0), or None when neither applies."""
    return node_user_data(efa=efa, raid0=raid0)
