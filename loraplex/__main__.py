"""``python -m loraplex``: the same command as the ``loraplex`` console script."""

from loraplex.cli import main

if __name__ == "__main__":
    main()
