"""Shared test settings.

In CI (``CI`` set, as the CI runner does) hypothesis runs derandomized: the same examples every
run, so a red CI always reproduces. Locally it explores new examples each run."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
