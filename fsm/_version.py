"""The version of retry-fsm, in one place: packaging metadata reads it (pyproject.toml,
``[tool.setuptools.dynamic]``), ``fsm.__version__`` and ``retry-fsm --version`` show it."""

__version__ = "0.2.0"
