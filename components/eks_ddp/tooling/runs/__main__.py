import sys

from eks_ddp.tooling.runs import main

sys.exit(main())
