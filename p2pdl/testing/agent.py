"""Entry point: ``python -m p2pdl.testing.agent`` (see ``_agent``)."""

from ._agent import main

if __name__ == "__main__":
    main()
