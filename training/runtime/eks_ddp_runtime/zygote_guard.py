"""Imported first by the zygote (the forkserver's preload, workers.Zygote) and by nothing else: the zygote dies with
the agent that started it (deathsig.py), so a SIGKILLed agent leaves no zygote forking workers behind. It does
nothing where the agent did not name itself (``EKS_DDP_AGENT_PID``)."""

from __future__ import annotations

import os

from .deathsig import AGENT_PID_ENV, tie_to_parent

_agent = os.environ.get(AGENT_PID_ENV, "")
if _agent.isdigit():
    tie_to_parent(int(_agent))
