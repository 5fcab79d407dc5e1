"""The local runner (``eks-ddp-local``, ``make demo``): the cluster's elastic job on one machine, with a real
etcd, the real launcher and the same agent command (``python -m eks_ddp_local --help``)."""
