"""Reproducible performance and accuracy runs that print tables and write JSON."""
