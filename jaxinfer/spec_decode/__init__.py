"""Speculative decoding: the engine-wide config, the host-side proposers
and the verification that runs inside the sampler program
(docs/speculative-decoding.md)."""
