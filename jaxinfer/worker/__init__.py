"""The device side: batch packing, the jitted step, sampling."""
