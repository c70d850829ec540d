"""The benchmarks' own scoring code, vendored as test oracles for tests/evals/test_official_scorers.py. Each file names
its source (repository, path, commit), its licence and what was changed. Never imported by the package; kept out of
ruff (pyproject.toml's extend-exclude) so that each stays comparable line by line with its source."""
