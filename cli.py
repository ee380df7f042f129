"""Lets `python cli.py ARGS` behave exactly like `tconform ARGS`."""

from tconform.cli import main

if __name__ == "__main__":
    main()
