"""The `lynxtop` commands: argument parsing and one module per command. Nothing below this package imports it."""
