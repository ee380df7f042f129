"""`python -m tconform ARGS` behaves exactly like `tconform ARGS`."""

from tconform.cli import main

main()
