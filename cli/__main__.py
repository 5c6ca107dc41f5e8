"""`python -m cli ...`: the `svfx` command."""

from cli.main import main

main()
