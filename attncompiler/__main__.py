"""`python -m attncompiler ...` is the `attncompiler` command."""
from attncompiler.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
