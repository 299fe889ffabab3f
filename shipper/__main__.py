"""`python -m shipper`: the same command line as `shipper` (commands/main.py), nothing of its own;
exits with what main returns."""

from shipper.commands.main import main

raise SystemExit(main())
