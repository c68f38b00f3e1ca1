"""Entry point: ``python -m p2pdl.testing.swarm_agent`` (see ``_swarm_agent``)."""

from ._swarm_agent import main

if __name__ == "__main__":
    main()
