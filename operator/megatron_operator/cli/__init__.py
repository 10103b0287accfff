"""The `mjob` command line: one module per group of sub-commands, shared pieces in `common`."""
