"""The package version (read by setuptools, printed by ``lookupdec --version``)."""

__version__ = "0.1.0"
