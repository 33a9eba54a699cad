"""Shared test doubles for the search tests."""


class CtrlCOnSecondUpdate:
    """A progress display whose second update raises KeyboardInterrupt (a user pressing Ctrl-C mid-search)."""

    def __init__(self):
        self.calls = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, *a, **k):
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt

    def note(self, msg):
        pass
