"""One module per CLI command; each defines `command` (a click.Command), added by attnforge.cli."""
