"""``python -m recipes fit --config recipes/configs/<name>.yaml``."""

from .cli import cli_main

if __name__ == "__main__":
    cli_main()
