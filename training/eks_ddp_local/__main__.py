import sys

from eks_ddp_local.cli import main

sys.exit(main())
