"""Shared layer: settings, layout, schemas, errors, topic metadata and the Delta read/write layer.

Every service imports it; it imports none of them.
"""
