"""Past one device group: the parallel configuration, multi-process
engines over ``jax.distributed`` (process 0 schedules and broadcasts each
step through JAX), and the Ray executor that places those processes."""
