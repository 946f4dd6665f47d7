"""Drafters: where candidate tokens come from. One drafter per module behind ``Drafter``."""
