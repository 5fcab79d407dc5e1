"""A module that leaves a Python thread running once imported: the negative control of the zygote's thread check
(tests/runtime/test_fork_threads.py preloads it with ``EKS_DDP_PRELOAD``)."""

import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, name="left-running-by-an-import", daemon=True).start()
