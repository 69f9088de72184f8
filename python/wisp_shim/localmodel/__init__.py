"""The local model layer: llama.cpp's server with SmolLM2, the Linux default model. Where it comes
from (llama_install), running it (llama_server, xllamacpp_server), whether and how to use it
(local_model), and its one interface to the rest of the shim (plugin: a `ModelCompanion`, which
core.process declares)."""
