"""One module per `localspec` subcommand."""
