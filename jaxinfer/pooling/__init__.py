"""Pooling (embedding) models: a decoder run prefill-only whose final-norm
hidden states are pooled into one vector per prompt (docs/pooling.md)."""
