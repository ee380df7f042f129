"""One module per `tconform` subcommand."""
