"""The benchmarks of scripts/bench.py, one module per subcommand, each with ``add_arguments(parser)``
and ``run(args)``, which prints its table and returns the figures for the JSON line. A module may
also define ``failed(report)``, true when bench.py should exit with status 1. The options they
share are in ``options``; the time-to-threshold rule is in ``threshold``."""
