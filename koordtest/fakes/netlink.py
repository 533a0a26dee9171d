"""pyroute2's netlink messages as the tests need them: a dict of fields with attributes by name."""
from __future__ import annotations


class Msg(dict):
    def __init__(self, attrs=None, **fields):
        super().__init__(**fields)
        self.attrs = attrs or {}

    def get_attr(self, name):
        return self.attrs.get(name)
