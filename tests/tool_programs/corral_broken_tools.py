"""A module that fails to import."""

raise RuntimeError("this module is broken on purpose")
