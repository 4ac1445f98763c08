"""Leaderboard submissions: reading one-file submissions, exporting the package's paths as one
file, and the local leaderboard that checks and times them the public harness's way.

A wing: the core (nvfp4lib's top-level modules and nvfp4lib.cute) never imports it."""
