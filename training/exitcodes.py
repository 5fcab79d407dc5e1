"""Exit codes of the trainer's processes, and what the training Job does with each.

A retry cannot fix any of these, so the Job's pod failure policy fails the Job at once on them
(``components/elastic_job.py`` mirrors the numbers; a test keeps the two equal) and the launcher
does not restart the workers for them. Every other non-zero exit is treated as transient
(a lost peer, a killed process) and recovered from.
"""

from __future__ import annotations

#: A bad trainer flag or value (argparse errors included): the command line must be fixed.
CONFIG_ERROR = 3
#: Training diverged: the loss or the weights became non-finite. Nothing non-finite was checkpointed.
DIVERGED = 4
#: The data set or the checkpoints are unreadable (a named file is corrupt or missing).
BAD_INPUT = 5

#: The fabric check (training/fabric_check.py) found the network unfit: no EFA, TCP transport, low bandwidth.
#: Only the fabric-check Job sees it; it is not a trainer code.
FABRIC_FAILED = 6

#: Every code above, for the pod failure policy and the launcher.
FATAL = (CONFIG_ERROR, DIVERGED, BAD_INPUT)
