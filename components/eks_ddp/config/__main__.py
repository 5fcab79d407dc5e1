"""``python -m eks_ddp.config``: print the stack config reference table; ``--write``: rewrite it in
``docs/configuration.md``; ``--schema``: print the stack file's JSON Schema (``docs/stack-config.schema.json``)."""

from __future__ import annotations

import sys

from eks_ddp.config.reference import DOC_PAGE, reference_table, schema_text, write_reference

if sys.argv[1:] == ["--write"]:
    print(f"{DOC_PAGE}: {'rewritten' if write_reference() else 'up to date'}")
elif sys.argv[1:] == ["--schema"]:
    print(schema_text(), end="")
elif sys.argv[1:]:
    sys.exit(f"python -m eks_ddp.config: got {' '.join(sys.argv[1:])!r}; expected no argument, --write or --schema")
else:
    print(reference_table())
