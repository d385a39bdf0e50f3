"""`python -m grpolab.tiny_model --check`: the shipped stand-ins against a rebuild (`--ship` writes them)."""

from grpolab.tiny_model import main

raise SystemExit(main())
