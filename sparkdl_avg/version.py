"""The package's version, in a module of its own: the driver's records and the executors' self-description
read it without importing the package root (which imports the whole public API)."""

__version__ = "0.1.0"
