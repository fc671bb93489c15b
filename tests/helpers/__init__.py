"""Helpers shared by the tests: a quiet trainer and an in-memory logger (``lightning``), a host-sync
counter (``sync_counting``), the Hock-Schittkowski problems (``hock_schittkowski``) and the 2-process
DDP task and workers (``ddp``)."""
