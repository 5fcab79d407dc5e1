"""eks-ddp's elastic runtime, importable as ``eks_ddp_runtime``: what any torchrun workload needs on the cluster.

* ``python -m eks_ddp_runtime.launch <torchrun flags> (-m MODULE | SCRIPT) args...`` — the agent every
  training Job runs (launch.py): torchrun with the Job's exit-code contract (exitcodes.py) and the
  ``eks-etcd`` rendezvous that rides out etcd restarts (rendezvous/handler.py, rendezvous/etcd_backend.py);
* what a worker can use: the process-group setup with the peer watchdog (dist.py, watchdog.py);
* ``python -m eks_ddp_runtime.fabric_check``, the network check a job can run first on its nodes (fabric_check.py);
* (the local runner's process helpers live in eks_ddp_local/procs.py).

It never imports the bundled trainer: ``pip install ./training/runtime`` puts it into any image that has torch.
"""
