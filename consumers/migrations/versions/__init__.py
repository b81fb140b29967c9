"""Revisions of the ``blackbox_views`` schema."""
