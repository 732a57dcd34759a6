"""Sectr's framework-free core: journal, fold, SessionContext, tools, runtime, providers."""

__version__ = "0.1.0"
