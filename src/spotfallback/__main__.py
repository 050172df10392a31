"""`python -m spotfallback`: the `spotfallback` command, for an environment without its script on PATH."""

from spotfallback.cli.app import main

main()
