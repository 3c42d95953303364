"""The control plane: API routers, auth, the scheduler loop and controllers, in one process."""
