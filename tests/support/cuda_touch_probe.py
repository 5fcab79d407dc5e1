"""Imported by the launcher's zygote in tests/runtime/test_launcher_cuda.py: initialises CUDA on import (torch's accelerator
check without NVML), as a careless preloaded library could. A fork of a process that did this cannot use a GPU."""

import torch

torch.accelerator.is_available()
