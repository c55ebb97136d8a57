"""The suites users run: one package per area, each with its claims.toml."""
