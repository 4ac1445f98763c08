"""Measuring the GEMV paths: timers, check-and-time, peers, streaming-read ceilings, calibration,
the results schema, tables and figures (`make bench`, `make bench-cute`, `make calibrate`,
`make sanitize`).

A wing: the core (nvfp4lib's top-level modules and nvfp4lib.cute) never imports it."""
