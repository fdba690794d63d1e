"""The `atrium` command line: `serve` runs the shell; every other command talks to it over HTTP."""
