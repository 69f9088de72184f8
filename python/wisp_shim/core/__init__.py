"""The core layer: wisp-core as the shim sees it. The pipe's messages and framing (protocol), a
call waiting on the core (pending) and its progress, the process's launch, run and stop
(process), its stdout read (reader), its watchdog and restarts (supervisor), and `Core`, the
client the layers above call (client). Imports only the package's shared leaves."""
