"""Atrium: an application platform shell that hosts sandboxed HTTP apps."""

__version__ = "0.1.0"
API_VERSION = 1
MANIFEST_SCHEMA = 1
