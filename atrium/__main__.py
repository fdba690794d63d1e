"""`python -m atrium` runs the CLI."""

from atrium.cli.main import main

main()
