"""`python -m jupyter_notebookos.simulator`: the `notebookos simulate` command, standalone."""

from jupyter_notebookos.simulator.cli import main

raise SystemExit(main())
