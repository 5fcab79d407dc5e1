"""``python -m eks_ddp.config``: print the stack config reference table; ``--write``: rewrite it in
``docs/configuration.md``."""

from __future__ import annotations

import sys

from eks_ddp.config.reference import DOC_PAGE, reference_table, write_reference

if sys.argv[1:] == ["--write"]:
    print(f"{DOC_PAGE}: {'rewritten' if write_reference() else 'up to date'}")
elif sys.argv[1:]:
    sys.exit(f"python -m eks_ddp.config: got {' '.join(sys.argv[1:])!r}; expected no argument or --write")
else:
    print(reference_table())
