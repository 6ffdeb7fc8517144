"""The engine loop: requests in, RequestOutputs out."""
