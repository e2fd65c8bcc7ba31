"""Review tooling: diagrams, their diff, the transition-coverage audit and its pytest plugin."""
